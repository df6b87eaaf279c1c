"""README.md stays true: every make target is documented there, and its config table is the generated one."""
import re
import subprocess
import sys

from pydantic import Field

from core.config import Section
from sao.config import Config, config_table


def _readme_table(readme: str) -> str:
    """The README's key table: the ``| key | default | ...`` header and the ``|`` lines after it."""
    lines = readme.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("| key | default |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "".join(lines[start:end])


def test_readme_config_table_is_the_generated_one(project_root, tmp_path):
    """Adding, removing or re-describing a key without regenerating README.md fails here; the fix is
    `.venv/bin/python scripts/readme_config_table.py` (or pasting `sao config --markdown`)."""
    r = subprocess.run([sys.executable, "-m", "sao.cli", "config", "--markdown"], cwd=tmp_path, check=False,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == config_table()
    readme = (project_root / "README.md").read_text()
    assert readme.count("| key | default |") == 1, "README.md has more than one config key table"
    assert _readme_table(readme) == r.stdout, ("README.md's config table differs from `sao config --markdown`: "
                                               "run .venv/bin/python scripts/readme_config_table.py")


def test_the_table_check_has_power(project_root):
    """A new key (and a changed default) makes the generated table differ from README.md's."""
    class Extra(Section):
        """A section a colleague just added."""

        knob: int = Field(1, description="a new key")

    class Bigger(Config):
        extra: Extra = Extra()

    readme_table = _readme_table((project_root / "README.md").read_text())
    assert "| `extra.knob` | `1` | a new key |" in config_table(Bigger())
    assert config_table(Bigger()) != readme_table
    assert config_table(Config(run={"seed": 7})) != readme_table


def test_every_make_target_is_documented(project_root):
    readme = (project_root / "README.md").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", (project_root / "Makefile").read_text(), re.MULTILINE).group(1).split()
    missing = [t for t in phony if f"`make {t}`" not in readme]
    assert not missing, f"make targets missing from README.md: {missing}"
