"""README.md stays true: every make target and every config key is documented there."""
import re

from sao.config import Config


def _keys(model, prefix=""):
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and hasattr(sub, "model_fields"):
            yield from _keys(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def test_every_config_key_is_documented(project_root):
    readme = (project_root / "README.md").read_text()
    missing = [k for k in _keys(Config) if f"`{k}`" not in readme]
    assert not missing, f"config keys missing from README.md: {missing}"


def test_every_make_target_is_documented(project_root):
    readme = (project_root / "README.md").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", (project_root / "Makefile").read_text(), re.M).group(1).split()
    missing = [t for t in phony if f"`make {t}`" not in readme]
    assert not missing, f"make targets missing from README.md: {missing}"
