"""README.md stays true and short: every make target and `sao` command is named there, its keys are real,
every relative link in it and in docs/ resolves, it is at most 25 KB, and docs/config.md's table of every
key is the generated one."""
import argparse
import re
import subprocess
import sys
from pathlib import Path

from pydantic import Field

from sao_harness.core.config import Section
from sao_harness.sao.cli import build_parser
from sao_harness.sao.config import Config, config_table

README_MAX_BYTES = 25 * 1024
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _key_table(text: str) -> str:
    """The key table of ``text``: the ``| key | default | ...`` header and the ``|`` lines after it."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("| key | default |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "".join(lines[start:end])


def _rows(table: str) -> dict[str, str]:
    """``key -> default`` of a key table's rows (``| `key` | `default` | ...``)."""
    return dict(re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|", table, re.MULTILINE))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(doc: Path) -> list[str]:
    """The relative links of the Markdown file ``doc`` (code blocks aside) whose file, or heading, is not there."""
    bad = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, frag = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{doc.name}: {target} (no such file)")
        elif frag and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", FENCE.sub("", dest.read_text()), re.MULTILINE)
            if frag not in {anchor(h) for h in headings}:
                bad.append(f"{doc.name}: {target} (no such heading)")
    return bad


def sao_commands(parser: argparse.ArgumentParser, prefix: str = "sao") -> list[tuple[str, ...]]:
    """Every command path of the CLI: ``("sao", "docker")``, ``("sao", "docker", "up")``, ..."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((*prefix.split(), name))
                out += sao_commands(sub, f"{prefix} {name}")
    return out


def undocumented(commands: list[tuple[str, ...]], readme: str) -> list[str]:
    """Commands the README does not name: ``sao X`` in a code span, and each subcommand in a span of
    ``sao X ...`` (``sao docker up | status | down``)."""
    spans = [re.split(r"[\s|\\]+", s.strip()) for s in re.findall(r"`(sao [^`]+)`", readme)]
    missing = []
    for cmd in commands:
        parent, last = list(cmd[:-1]), cmd[-1]
        if not any(words[:len(parent)] == parent and last in words[len(parent):] for words in spans):
            missing.append(" ".join(cmd))
    return missing


def test_docs_config_table_is_the_generated_one(project_root, tmp_path):
    """Adding, removing or re-describing a key without regenerating docs/config.md fails here; the fix is
    `.venv/bin/python scripts/config_table.py` (or pasting `sao config --markdown`)."""
    r = subprocess.run([sys.executable, "-m", "sao_harness.sao.cli", "config", "--markdown"], cwd=tmp_path, check=False,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == config_table()
    doc = (project_root / "docs" / "config.md").read_text()
    assert doc.count("| key | default |") == 1, "docs/config.md has more than one config key table"
    assert _key_table(doc) == r.stdout, ("docs/config.md's config table differs from `sao config --markdown`: "
                                         "run .venv/bin/python scripts/config_table.py")


def test_the_table_check_has_power(project_root):
    """A new key (and a changed default) makes the generated table differ from docs/config.md's."""
    class Extra(Section):
        """A section a colleague just added."""

        knob: int = Field(1, description="a new key")

    class Bigger(Config):
        extra: Extra = Extra()

    doc_table = _key_table((project_root / "docs" / "config.md").read_text())
    assert "| `extra.knob` | `1` | a new key |" in config_table(Bigger())
    assert config_table(Bigger()) != doc_table
    assert config_table(Config(run={"seed": 7})) != doc_table


def test_readme_keys_are_real_and_their_defaults_are_the_codes(project_root):
    readme_rows = _rows(_key_table((project_root / "README.md").read_text()))
    every = _rows(config_table())
    assert len(readme_rows) == 20, sorted(readme_rows)
    wrong = {k: (v, every.get(k)) for k, v in readme_rows.items() if every.get(k) != v}
    assert not wrong, f"README.md keys unknown or with another default (README, code): {wrong}"


def test_every_make_target_is_documented(project_root):
    readme = (project_root / "README.md").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", (project_root / "Makefile").read_text(), re.MULTILINE).group(1).split()
    missing = [t for t in phony if f"`make {t}`" not in readme]
    assert not missing, f"make targets missing from README.md: {missing}"


def test_every_sao_command_is_documented(project_root):
    commands = sao_commands(build_parser())
    assert ("sao", "doctor") in commands and ("sao", "docker", "up") in commands
    missing = undocumented(commands, (project_root / "README.md").read_text())
    assert not missing, f"sao commands missing from README.md: {missing}"
    # the check has power: a command the README does not name is reported, a named one is not
    assert undocumented([("sao", "frobnicate"), ("sao", "docker", "prune")], "`sao docker up \\| down`") == \
        ["sao frobnicate", "sao docker prune"]


def test_every_relative_link_resolves(project_root, tmp_path):
    docs = [project_root / "README.md", *sorted((project_root / "docs").rglob("*.md"))]
    bad = [b for doc in docs for b in broken_links(doc)]
    assert not bad, f"broken links: {bad}"
    # the check has power: a missing file and a missing heading are both reported
    (tmp_path / "a.md").write_text("# Title\n[x](b.md) [y](a.md#title) [z](a.md#nope) [w](https://e.org/x)\n")
    assert broken_links(tmp_path / "a.md") == ["a.md: b.md (no such file)", "a.md: a.md#nope (no such heading)"]


def test_readme_is_at_most_25_kb(project_root):
    size = (project_root / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/ "
                                      "(results to docs/results/, keys to docs/config.md)")


def test_results_say_command_machine_and_wall_time(project_root):
    """Each study in docs/results/ says how it was run, where, and how long it took."""
    for f in sorted(Path(project_root / "docs" / "results").glob("*.md")):
        text = f.read_text()
        if f.name == "vllm-cpu.md":
            continue  # the vLLM figures' own layout: setup, tests and timings per table
        for field in ("**Command:**", "**Machine:**", "**Wall time:**"):
            assert field in text, f"{f.name} lacks {field}"
