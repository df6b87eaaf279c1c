"""Can the proxy serve the agent's tools with this model's chat template? Asked before the first episode.

With ``proxy.tool_format: native`` every request carries ``tools``. The proxy can serve them only when
the chat template renders the tool definitions into the prompt (else the model never sees them) and a
tool parser is in force (else the proxy answers each request 400 ``no_tool_parser``); and, like any
config, when the template can be continued (``template_from_config``). A config that fails this is a
user error found at start (``sao rollout`` / ``sao train`` / ``sao eval``'s pre-flight, ``sao config``,
``sao doctor``), never an infra error per episode.

``tool_support(template, proxy_cfg) -> ToolSupport`` judges a loaded template;
``model_tool_support(model_cfg, proxy_cfg, model_path=, local_only=)`` loads the model's tokenizer first;
``require_tool_support(...)`` raises the one-line ``UserError`` (its fix: ``proxy.tool_format=prompt`` for
a template that ignores tools, ``proxy.tool_parser`` for one whose call format the proxy does not know).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.harness.proxy.parsers import TOOL_PARSERS, parsers_from_config
from sao_harness.harness.proxy.template import ChatTemplate, template_from_config

PROMPT_FIX = "proxy.tool_format=prompt (the agent describes its tools in the prompt text)"
# a tool whose name and description no template writes by itself: seen in the prompt = the tools are rendered
PROBE_TOOL = {"type": "function", "function": {
    "name": "sao_probe_tool", "description": "sao probe tool description",
    "parameters": {"type": "object", "properties": {"sao_probe_arg": {"type": "string"}}}}}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
PROBE_MESSAGES = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it."}]


@dataclass(frozen=True)
class ToolSupport:
    """The verdict: ``status`` ok | FAIL | -- (not checked); ``detail`` what was found; ``fix`` how to
    make the config work (empty when ok)."""

    status: str
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"

    def message(self) -> str:
        """One line: what is wrong and its fix."""
        return f"{self.detail}; fix: {self.fix}" if self.fix else self.detail


def tool_support(template: ChatTemplate, proxy_cfg, model: str = "the model") -> ToolSupport:
    """Whether the proxy can serve ``proxy_cfg.tool_format`` requests with ``template`` (see the module)."""
    if proxy_cfg.tool_format != "native":
        return ToolSupport("ok", f"proxy.tool_format={proxy_cfg.tool_format}: the tools are described in the "
                                 "prompt text (no tool parser needed)")
    head = f"proxy.tool_format=native with the chat template of {model}"
    try:
        text = template.render(PROBE_MESSAGES, [PROBE_TOOL], True)
    except Exception as e:  # noqa: BLE001  (jinja2's errors, a raise_exception: the proxy would answer 400)
        return ToolSupport("FAIL", f"{head}: the template cannot render a request with tools "
                                   f"({type(e).__name__}: {e})".replace("\n", " "),
                           f"{PROMPT_FIX}, or a proxy.chat_template that renders tools")
    if PROBE_TOOL["function"]["name"] not in text:
        return ToolSupport("FAIL", f"{head}: the template ignores `tools` (the tool definitions never reach "
                                   "the model's prompt, so every episode would fail)",
                           f"{PROMPT_FIX}, or a proxy.chat_template that renders tools")
    tool_parser, _ = parsers_from_config(template, proxy_cfg)
    if tool_parser is None:
        return ToolSupport("FAIL", f"{head}: the template renders tools but teaches no tool-call format the "
                                   f"proxy knows ({', '.join(sorted(TOOL_PARSERS))}), so the proxy would "
                                   "refuse every request (400 no_tool_parser)",
                           f"proxy.tool_parser=NAME (the format the model writes), or {PROMPT_FIX}")
    return ToolSupport("ok", f"native tool calls: the template renders tools, parser {tool_parser}")


def _tiny_dir(model_cfg) -> Path:
    from sao_harness.harness.tiny_model import recipe_hash  # lazy: reads the tokenizer corpus list

    return Path(model_cfg.cache_dir) / f"tiny-qwen3moe-s{model_cfg.tiny_seed}-{recipe_hash(model_cfg.tiny_seed)}"


def model_tool_support(model_cfg, proxy_cfg, model_path: str | None = None, local_only: bool = False) -> ToolSupport:
    """``tool_support`` for the tokenizer of ``model_path`` (default: ``model.path``; ``tiny`` = the tiny
    model, whose own template and parser are known good: not loaded). ``local_only``: nothing is built
    or downloaded; a tokenizer not on this machine is ``--``. A template the proxy cannot even load or
    continue (``template_from_config``) is a FAIL with that error's own fix."""
    path = model_path or model_cfg.path
    if path == "tiny":
        if proxy_cfg.chat_template is None and proxy_cfg.tool_parser is None:
            # harness.tiny_model.CHAT_TEMPLATE: known (and tested) to serve tools; nothing loaded or built
            return ToolSupport("ok", "the tiny model's own template (Hermes tool calls, parser hermes)")
        tiny = _tiny_dir(model_cfg)
        if not (tiny / "sao_recipe.json").is_file():
            if local_only:
                return ToolSupport("--", "not checked: the tiny model is not built yet (the run checks it)")
            from sao_harness.harness.tiny_model import ensure_tiny_model  # lazy: builds it (the run would)

            ensure_tiny_model(model_cfg.cache_dir, model_cfg.tiny_seed)
        path = str(tiny)
    if local_only and Path(path).is_dir() and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        return ToolSupport("--", f"not checked: {path} holds no tokenizer (the run checks it)")
    from transformers import AutoTokenizer  # lazy: heavy

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    except Exception as e:  # noqa: BLE001  (not there, not a tokenizer: the run itself says so)
        if local_only:
            return ToolSupport("--", f"not checked: no tokenizer of {path} on this machine (the run checks it)")
        why = f"{type(e).__name__}: {e}".replace("\n", " ")
        raise UserError(f"model.path={path}: its tokenizer does not load ({why}); fix: point model.path at a model "
                        "directory with a tokenizer, or a Hugging Face id") from None
    try:
        template = template_from_config(tokenizer, proxy_cfg)
    except UserError as e:
        return ToolSupport("FAIL", f"the chat template of {path}: {e}".replace("\n", " "))
    return tool_support(template, proxy_cfg, path)


def require_tool_support(model_cfg, proxy_cfg, model_path: str | None = None) -> None:
    """``model_tool_support``, raising its one line as a ``UserError`` (exit 2) when it fails."""
    verdict = model_tool_support(model_cfg, proxy_cfg, model_path)
    if not verdict.ok:
        raise UserError(verdict.message())
