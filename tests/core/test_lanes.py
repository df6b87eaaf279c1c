"""`make test`'s jobs (scripts/test_lanes.py): every test file is in exactly one Docker job and one Docker-free
job, every path they name exists, and the tests that stop the Docker engine are marked `exclusive`, so that
they never run beside a job that uses it."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lanes():
    spec = importlib.util.spec_from_file_location("test_lanes_script", ROOT / "scripts/test_lanes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while it loads
    spec.loader.exec_module(module)
    return module


def test_every_ray_lane_path_exists():
    lanes = _lanes()
    missing = [p for p in lanes.RAY_LANE + [p for g in lanes.RAY_GROUPS for p in g] if not (ROOT / p).exists()]
    assert not missing, f"scripts/test_lanes.py names paths that are gone: {missing}"


def test_every_test_runs_in_exactly_one_job():
    """Each file's Docker tests are in one job, its Docker-free tests in one other, its exclusive ones in
    `exclusive`; a group of Ray files is a subset of the Ray lane (its Docker tests run in `ray docker`)."""
    lanes = _lanes()
    files, jobs = lanes.test_files(), lanes.jobs()
    assert {p for g in lanes.RAY_GROUPS for p in g} <= set(lanes.RAY_LANE)
    for marker in (lanes.DOCKER, lanes.PLAIN):
        count = {f: sum(f in j.files(files) for j in jobs if j.marker == marker) for f in files}
        assert {f: n for f, n in count.items() if n != 1} == {}, marker
    (exclusive,) = [j for j in jobs if j.marker == lanes.EXCLUSIVE]
    assert set(lanes.exclusive_files()) == set(exclusive.files(files)) and exclusive is jobs[-1]
    assert [j.marker for j in jobs[:2]] == [lanes.DOCKER, lanes.DOCKER]  # the Docker jobs start first


def test_a_test_that_stops_the_engine_is_exclusive():
    """A test function that stops or restarts the project engine (the one every sandbox runs on) carries
    @pytest.mark.exclusive; the lanes deselect it and run it alone after them."""
    assert "tests/harness/test_faults.py" in _lanes().exclusive_files()
    unmarked = []
    for path in set((ROOT / "tests").rglob("test_*.py")) - {Path(__file__).resolve()}:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            body = ast.unparse(node)
            stops_main = "engine_restart" in body or "stop_project_engine(DockerConfig())" in body
            marks = {ast.unparse(d) for d in node.decorator_list}
            if stops_main and "pytest.mark.exclusive" not in marks:
                unmarked.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert not unmarked, unmarked
