"""`make test`'s lanes (scripts/test_lanes.py): every path of the Ray lane exists, and the tests that stop the
Docker engine are marked `exclusive`, so that they never run beside a lane."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lanes():
    spec = importlib.util.spec_from_file_location("test_lanes_script", ROOT / "scripts/test_lanes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_ray_lane_path_exists():
    missing = [p for p in _lanes().RAY_LANE if not (ROOT / p).exists()]
    assert not missing, f"scripts/test_lanes.py RAY_LANE names paths that are gone: {missing}"


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
