"""The test commands other projects' harnesses run, for the datasets whose rows do not carry one.

- ``SWE_GYM``: per repo, the ``test_cmd`` (and ``eval_commands``) of SWE-Gym's fork of the SWE-bench
  harness (``MAP_REPO_VERSION_TO_SPECS`` for the 11 SWE-Gym repos: the same for every version of a
  repo but mypy, which drops ``-n0`` from 1.7, ``versions``); graded with swebench's
  ``parse_log_pytest``, as there. mypy runs the named cases (``-k "a or b"``), as SWE-Gym's and
  SWE-smith's harnesses do.
- ``swe_smith_test_cmd(profile, tests)``: SWE-smith's repo profiles (the ``swesmith`` package,
  ``swesmith/profiles/python.py``). ``swesmith`` cannot be imported next to swebench 5.x (it imports
  swebench 4.x names: ``DOCKER_USER``, ``KEY_INSTANCE_ID``, ``swebench.harness.dockerfiles``), so the
  profiles' logic is restated: a Python profile runs ``pytest --disable-warnings --color=no --tb=no
  --verbose`` on the test files of FAIL_TO_PASS / PASS_TO_PASS (its ``min_testing`` mode), here with
  ``-rA`` so that swebench's ``parse_log_pytest`` reads the outcome (SWE-smith's own parser reads the
  ``--verbose`` lines: the same statuses). Profiles with a non-pytest runner, and non-Python ones,
  are reported, not guessed.
"""
from __future__ import annotations

import shlex

SWEBENCH_PYTEST = "pytest --no-header -rA --tb=no -p no:cacheprovider"  # swebench's TEST_PYTEST
SWE_SMITH_ORG = "jyangballin"  # the Docker Hub org of SWE-smith's published images

SWE_GYM: dict[str, dict] = {  # keys lowercased, as SWE-Gym's harness looks them up
    "getmoto/moto": {"test_cmd": "pytest -n0 -rA"},
    "python/mypy": {"test_cmd": "pytest -n0 -rA -k", "k": True,
                    "versions": dict.fromkeys(("1.7", "1.8", "1.9", "1.10", "1.11"), "pytest -rA -k")},
    "conan-io/conan": {"test_cmd": "pytest -n0 -rA", "eval_commands": ["export PYTHONPATH=${PYTHONPATH:-}:$(pwd)"]},
    "dask/dask": {"test_cmd": "pytest -n0 -rA  --color=no"},
    "project-monai/monai": {"test_cmd": "pytest -rA "},
    "iterative/dvc": {"test_cmd": "pytest -rA"},
    "bokeh/bokeh": {"test_cmd": "pytest -rA -n0"},
    "modin-project/modin": {"test_cmd": "pytest -n0 -rA"},
    "pydantic/pydantic": {"test_cmd": "pytest -rA --tb=short -vv -o console_output_style=classic --no-header"},
    "pandas-dev/pandas": {"test_cmd": "pytest -rA --tb=long"},
    "facebookresearch/hydra": {"test_cmd": "pytest -rA --tb=long"},
}


def mypy_k_expression(tests: list[str]) -> list[str]:
    """``-k`` argument selecting mypy's data-driven cases by name (the id's last ``::`` part)."""
    names = list(dict.fromkeys(t.rsplit("::", 1)[-1] for t in tests))
    return [" or ".join(names)] if names else []


# --- SWE-smith ---------------------------------------------------------------------------------
SMITH_PYTEST = "pytest --disable-warnings --color=no --tb=no --verbose"
SMITH_OVERRIDES = {  # owner__repo -> test command, where the profile changes the default
    "python__mypy": "pytest --color=no -rA -k",
    "paramiko__paramiko": "pytest -rA --color=no --disable-warnings",
    "mido__mido": "pytest --disable-warnings --color=no --tb=no --verbose -rs -c /dev/null",
    "pydantic__pydantic": "/root/.local/bin/uv run pytest --disable-warnings --color=no --tb=no --verbose",
}
SMITH_NOT_PYTEST = {  # profiles whose runner is not pytest (their own log parsers)
    "tornadoweb__tornado": "python -m tornado.test",
    "un33k__python-slugify": "python test.py",
}


def swe_smith_test_cmd(profile: str, tests: list[str]) -> tuple[str | None, str]:
    """(test command, "") for SWE-smith profile ``owner__repo.commit8``, or (None, why not)."""
    key = profile.rsplit(".", 1)[0]
    if "__" not in key:
        return None, f"repo {profile!r} does not name a SWE-smith profile (owner__repo.commit8)"
    if key in SMITH_NOT_PYTEST:
        return None, (f"SWE-smith's {key} profile runs {SMITH_NOT_PYTEST[key]!r} with its own log parser, "
                      "which has no swebench equivalent")
    files = list(dict.fromkeys(t.split("::", 1)[0] for t in tests if "::" in t))
    if not files or not all(f.endswith(".py") for f in files):
        return None, (f"the tests of {key} are not pytest node ids: its SWE-smith profile is not a Python one, "
                      "not mapped to a swebench log parser here")
    cmd = SMITH_OVERRIDES.get(key, SMITH_PYTEST)
    if key == "python__mypy":
        return f"{cmd} {shlex.quote(mypy_k_expression(tests)[0])}", ""
    if "-rA" not in cmd:
        cmd += " -rA"
    return " ".join([cmd, *(shlex.quote(f) for f in files)]), ""
