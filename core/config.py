"""Config loading: a YAML file plus dotted overrides (``trainer.lr=1e-6``), validated by pydantic.

Every package defines its own sections as ``Section`` models (``extra="forbid"``, so an unknown key
is an error that names it); ``sao.config`` assembles them into the run config. Every failure is a
``ConfigError`` with a one-line message that names the file or key; the CLI prints it and exits 2.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ConfigError(ValueError):
    """A configuration problem, reported to the user as one line (exit code 2)."""


class Section(BaseModel):
    """A config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    """The run: its directory (``<root>/<name>``) and its seed."""

    name: str = Field("local", description="the run directory is `<root>/<name>`; reusing a name resumes the run")
    root: Path = Field(Path("runs"), description="where run directories live")
    seed: int = Field(0, description="seeds sampling, task order and the trainer")

    @property
    def dir(self) -> Path:
        """The run directory, ``root / name``."""
        return self.root / self.name


def parse_value(text: str) -> Any:
    """An override's value is YAML: ``1e-6`` -> float, ``true`` -> bool, ``[a, b]`` -> list."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_override(data: dict, dotted: str, value: Any) -> None:
    """``data[a][b][c] = value`` for ``dotted = "a.b.c"``, creating sections on the way."""
    keys = dotted.split(".")
    if any(k == "" for k in keys):
        raise ConfigError(f"override '{dotted}': empty key segment")
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{key}' is not a section")
        node = child
    node[keys[-1]] = value


def load_yaml(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> tuple[dict, str]:
    """The raw mapping of ``path`` with ``key.sub=value`` overrides on top, and a source label for errors."""
    data: dict = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: invalid YAML: {str(e).splitlines()[0]}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping of sections")
        data = loaded or {}
        source = str(p)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key.sub=value")
        key, _, raw = item.partition("=")
        apply_override(data, key.strip(), parse_value(raw))
    if overrides:
        source += " + overrides"
    return data, source


def format_error(err: ValidationError, source: str) -> str:
    """pydantic's first error as one line that names the whole dotted key (``bogus.key``)."""
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"]]
    if first["type"] == "extra_forbidden":
        value = first.get("input")
        while isinstance(value, dict) and len(value) == 1:
            (k, value), = value.items()
            loc.append(str(k))
        return f"{source}: unknown config key '{'.'.join(loc)}'"
    key = ".".join(loc)
    if not loc:  # a check across sections
        return f"{source}: {first['msg'].removeprefix('Value error, ')}"
    if first["type"] == "missing":
        return f"{source}: missing config key '{key}'"
    return f"{source}: config key '{key}': {first['msg']} (got {first.get('input')!r})"


def validate(model: type[BaseModel], data: dict, source: str):
    """``model.model_validate(data)``, with a failure as a one-line ``ConfigError``."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_error(e, source)) from None


def dump_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
