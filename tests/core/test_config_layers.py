"""Each layer reads only config sections of its own layer and the layers below (docs/config.md, "Who owns a
section").

A section belongs to the layer whose package defines its model: read from the run config's field types
(``sao.config.Config``), not from a list kept by hand. A read is an attribute of the run config named
like a section (``cfg.eval``, ``args.cfg.runtime``, ``getattr(cfg, "trainer", None)``), where the run
config is, by the project's convention, a name or attribute ``cfg``, ``config`` or ``*_cfg``. The power
check shows a synthetic module that reads a higher section fails.
"""
from __future__ import annotations

import ast
from pathlib import Path

from sao_harness.harness.config import HarnessConfig
from sao_harness.sao.config import Config

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("core", "envs", "tasks", "harness", "trainer", "eval", "sao")  # bottom to top (docs/architecture.md)
NOT_PRODUCT = ("suite", "bundled")  # tasks/suite, tasks/bundled: the task repos' own code
# Reads still to move, each with what its fix is: (file, section) -> why. An entry that no longer occurs fails.
PENDING: dict[tuple[str, str], str] = {}


def section_layers() -> dict[str, str]:
    """{section: the layer that defines its model}, from the run config's field types."""
    out = {}
    for name, field in Config.model_fields.items():
        module = field.annotation.__module__  # sao_harness.<layer>.config, sao_harness.harness.testbeds.config
        out[name] = module.split(".")[1]
    return out


def _is_config(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in ("cfg", "config") or name.endswith("_cfg")


def section_reads(source: str) -> list[tuple[int, str]]:
    """(line, section name) of every attribute read of the run config named like a section."""
    sections = set(section_layers())
    reads = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in sections and _is_config(node.value):
            reads.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and _is_config(node.args[0]) and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in sections):
            reads.append((node.lineno, node.args[1].value))
    return sorted(reads)


def higher_reads(layer: str, source: str) -> list[str]:
    """``line: section (layer)`` for every read in ``source`` (a module of ``layer``) of a higher layer's section."""
    owner = section_layers()
    return [f"{line}: {name} ({owner[name]})" for line, name in section_reads(source)
            if LAYERS.index(owner[name]) > LAYERS.index(layer)]


def test_every_section_belongs_to_a_layer():
    layers = section_layers()
    assert set(layers.values()) <= set(LAYERS), layers
    assert {link.name for link in (ROOT / "sao_harness").iterdir() if link.is_symlink()} == set(LAYERS)
    assert layers["grading"] == "tasks" and layers["cluster"] == "trainer" and layers["eval"] == "eval"


def test_harness_config_holds_exactly_the_sections_up_to_harness():
    """Harness code is typed with HarnessConfig: every section it may read, and none above; Config extends it."""
    up_to_harness = {s for s, layer in section_layers().items() if LAYERS.index(layer) <= LAYERS.index("harness")}
    assert set(HarnessConfig.model_fields) == up_to_harness
    assert issubclass(Config, HarnessConfig)


def test_no_module_reads_a_section_of_a_higher_layer():
    found, pending = [], set()
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if any(part in NOT_PRODUCT for part in path.parts):
                continue
            rel = path.relative_to(ROOT).as_posix()
            for read in higher_reads(layer, path.read_text()):
                section = read.split(": ")[1].split()[0]
                if (rel, section) in PENDING:
                    pending.add((rel, section))
                else:
                    found.append(f"{rel}:{read}")
    assert not found, "config sections read below the layer that defines them (pass the values down):\n" + \
        "\n".join(found)
    assert pending == set(PENDING), f"fixed, remove from PENDING: {sorted(set(PENDING) - pending)}"


def test_a_read_of_a_higher_section_is_found():
    """Power check: each way of reading a section of a higher layer is caught, and a lower one is not."""
    source = ("def f(cfg, args, self):\n"
              "    a = cfg.eval.max_workers\n"
              "    b = args.cfg.runtime.ray_address\n"
              "    c = getattr(self.cfg, 'trainer', None)\n"
              "    d = eval_cfg.cluster\n"
              "    return cfg.grading.timeout_s, cfg.sandbox, model.eval()\n")
    assert higher_reads("tasks", source) == ["2: eval (eval)", "3: runtime (trainer)", "4: trainer (trainer)",
                                             "5: cluster (trainer)"]
    assert higher_reads("sao", source) == []
