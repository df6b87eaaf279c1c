"""The model families whose published chat templates the proxy is tested on (fixtures/templates/), each
on a copy of the tiny model that speaks that family's format (``templated_tiny_model``), and how a model
of that family writes a reply: reasoning, text, tool calls and the stop token it samples.

Adding a family: put its published template in fixtures/templates/, add a ``Family`` with the special
tokens, EOS / stop tokens and the call format of its model card, and every test over ``FAMILIES`` runs it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sao_harness.harness.tiny_model import templated_tiny_model

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
REPO = Path(__file__).resolve().parents[2]


def hermes_calls(calls) -> str:
    return "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>' for n, a in calls)


def coder_calls(calls) -> str:
    def value(v):
        return v if isinstance(v, str) else json.dumps(v)
    return "\n".join(f"<tool_call>\n<function={n}>\n"
                     + "".join(f"<parameter={k}>\n{value(v)}\n</parameter>\n" for k, v in a.items())
                     + "</function>\n</tool_call>" for n, a in calls)


def llama_calls(calls) -> str:
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def glm_calls(calls) -> str:
    def value(v):
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    return "\n".join(f"<tool_call>{n}\n"
                     + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{value(v)}</arg_value>\n" for k, v in a.items())
                     + "</tool_call>" for n, a in calls)


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # file under fixtures/templates/
    tool_parser: str  # the parser the proxy must pick from the template (vLLM's name)
    reasoning_parser: str | None
    write_calls: object  # calls [(name, args)] -> the text the model writes
    stop: str  # the token the model samples to end a turn
    stop_to_user: str | None = None  # GLM: the token that ends a turn without a call (hands it to the user)
    special: tuple[str, ...] = ()
    eos: str | None = None
    bos: str | None = None
    extra_stops: tuple[str, ...] = ()
    think: str | None = None  # "open": the reply opens <think> itself; "prompted": the generation prompt did
    strips_reasoning: bool = False  # a full render drops the reasoning of turns before the last user query
    kwargs: dict = field(default_factory=dict)

    def reply(self, reasoning: str | None, content: str, calls) -> str:
        """The model's sampled text of one turn, stop token included."""
        body = self.content(content, calls)
        if calls:
            body = (body + "\n" if body else "") + self.write_calls(calls)
        if self.tool_parser == "glm45":
            text = f"\n<think>{reasoning or ''}</think>\n{body}"
            return text + (self.stop if calls else self.stop_to_user)
        if self.think == "open":
            body = f"<think>\n{reasoning}\n</think>\n\n{body}"
        elif self.think == "prompted":
            body = f"{reasoning}\n</think>\n\n{body}"
        return body + self.stop

    def content(self, content: str, calls) -> str:
        """The text a reply carries besides its calls (a Llama 3 call is the whole reply)."""
        return "" if calls and self.tool_parser == "llama3_json" else content

    def model_dir(self) -> Path:
        return templated_tiny_model(REPO / ".cache" / "sao", self.name, (TEMPLATES / self.template).read_text(),
                                    self.special, self.eos, self.bos, self.extra_stops)


LLAMA_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<|eom_id|>", "<|python_tag|>")
GLM_SPECIAL = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<arg_key>",
               "</arg_key>", "<arg_value>", "</arg_value>")

FAMILIES = {f.name: f for f in [
    Family("qwen2.5", "qwen2.5.jinja", "hermes", None, hermes_calls, "<|im_end|>", extra_stops=("<|endoftext|>",)),
    Family("qwen3", "qwen3.jinja", "hermes", "qwen3", hermes_calls, "<|im_end|>", think="open",
           strips_reasoning=True, extra_stops=("<|endoftext|>",)),
    Family("qwen3-thinking-2507", "qwen3-thinking-2507.jinja", "hermes", "qwen3", hermes_calls, "<|im_end|>",
           think="prompted", strips_reasoning=True, extra_stops=("<|endoftext|>",)),
    Family("qwen3-coder", "qwen3-coder.jinja", "qwen3_coder", None, coder_calls, "<|im_end|>",
           extra_stops=("<|endoftext|>",)),
    Family("llama3.1", "llama3.1.jinja", "llama3_json", None, llama_calls, "<|eot_id|>", special=LLAMA_SPECIAL,
           eos="<|eot_id|>", bos="<|begin_of_text|>", extra_stops=("<|eom_id|>", "<|end_of_text|>")),
    Family("glm4.6", "glm4.6.jinja", "glm45", "glm45", glm_calls, "<|observation|>", stop_to_user="<|user|>",
           special=GLM_SPECIAL, eos="<|endoftext|>", extra_stops=("<|user|>", "<|observation|>"),
           strips_reasoning=True),
]}
