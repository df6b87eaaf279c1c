"""Probes on perturbed inputs (tasks/grading/perturb.py) against the bundled suite, without Docker.

Every task's code base is copied twice (base + test patch, and + gold patch too); the probes of its
FAIL_TO_PASS test files are run with this interpreter's pytest. Measured (printed, `pytest -s`): the
FAIL_TO_PASS tests with nothing to perturb, and how often a gold patch with one hunk dropped differs.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sao_harness.tasks.grading.perturb import Difference, Probe, build_probe, compare, parse_records

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tasks" / "suite"
BUNDLED = ROOT / "tasks" / "bundled" / "tasks"
TASKS = sorted(p.name.split("__", 1)[1] for p in BUNDLED.iterdir())
RECORDS = "_sao_records.jsonl"
WORKERS = min(16, 2 * (os.cpu_count() or 1))

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def probe_file(path: str) -> str:
    """Where the probe of the test file ``path`` is written (``<dir of path>/_sao_probe_<hex>.py``)."""
    return str(Path(path).parent / f"_sao_probe_{hashlib.sha1(path.encode()).hexdigest()[:8]}.py")


def git(cwd: Path, *args: str) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)


def patch_of(task: str, which: str) -> str:
    codebase, n = task.rsplit("-", 1)
    return (SUITE / codebase / "tasks" / n / f"{which}.patch").read_text()


def f2p_of(task: str) -> dict[str, list[str]]:
    """{test file: [FAIL_TO_PASS names within it]}."""
    out: dict[str, list[str]] = {}
    for test_id in json.loads((BUNDLED / f"sao-harness__{task}" / "tests.json").read_text())["FAIL_TO_PASS"]:
        path, name = test_id.split("::", 1)
        out.setdefault(path, []).append(name)
    return out


def derive(src: Path, dst: Path, *patches: str) -> Path:
    shutil.copytree(src, dst)
    for i, text in enumerate(patches):
        (dst / f".p{i}.diff").write_text(text)
        git(dst, "apply", f".p{i}.diff")
        (dst / f".p{i}.diff").unlink()
    return dst


def hunks(patch: str) -> list[tuple[str, list[str]]]:
    """[(file header, [hunk, ...]), ...] of a unified diff."""
    files = []
    for section in re.split(r"(?m)^(?=diff --git )", patch):
        if section.strip():
            head, *rest = re.split(r"(?m)^(?=@@ )", section)
            files.append((head, rest))
    return files


def without_hunk(patch: str, drop: int) -> str:
    out, i = [], 0
    for head, hs in hunks(patch):
        kept = [h for j, h in enumerate(hs) if i + j != drop]
        i += len(hs)
        if kept:
            out.append(head + "".join(kept))
    return "".join(out)


def run(repo: Path, probes: dict[str, Probe], tests: list[str] = ()) -> tuple[dict, set[str]]:
    """Write the probes into repo, run them (and ``tests``): (records, the node ids that passed)."""
    (repo / RECORDS).unlink(missing_ok=True)
    files = []
    for path, probe in probes.items():
        (repo / probe_file(path)).write_text(probe.source)
        files.append(probe_file(path))
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", f"--rootdir={repo}", *files, *tests],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120,
    )
    if proc.returncode == 4 and tests:  # a graded test cannot be collected: it fails; the probes alone
        return run(repo, probes)[0], set()
    assert proc.returncode in (0, 1, 2, 5), proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = set(re.findall(r"(?m)^PASSED (\S+)", proc.stdout))
    data = (repo / RECORDS).read_bytes() if (repo / RECORDS).exists() else b""
    return parse_records(data), passed


def probes_for(task: str, repo: Path, **kw) -> dict[str, Probe]:
    return {path: build_probe(path, (repo / path).read_text(), names, random.Random(f"{task}:{path}"),
                              records_path=RECORDS, **kw)
            for path, names in f2p_of(task).items()}


def judge(gold: tuple, candidate: dict, probes: dict[str, Probe]) -> tuple[list[Difference], list[str]]:
    """compare, probe file by probe file (their function names repeat)."""
    diffs, missing = [], []
    for path, probe in probes.items():
        prefix = probe_file(path) + "::"
        mine = [{n: r for n, r in recs.items() if n.startswith(prefix)} for recs in (*gold, candidate)]
        d, m = compare(*mine, inputs=probe.inputs)
        diffs += d
        missing += m
    return diffs, missing


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> dict[str, dict]:
    """Per task: its repos, its probes and the two gold runs."""
    tmp = tmp_path_factory.mktemp("perturb")

    def one(task: str) -> dict:
        codebase, _ = task.rsplit("-", 1)
        base = tmp / task / "base"
        shutil.copytree(SUITE / codebase / "base", base)
        git(base, "init", "-q")
        git(base, "add", "-A")
        git(base, "commit", "-qm", "base")
        tests = derive(base, tmp / task / "tests", patch_of(task, "test"))
        gold = derive(tests, tmp / task / "gold", patch_of(task, "fix"))
        probes = probes_for(task, tests)
        return {"tests": tests, "gold": gold, "probes": probes, "runs": (run(gold, probes)[0], run(gold, probes)[0])}

    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(zip(TASKS, pool.map(one, TASKS)))


def test_suite_has_twenty_tasks():
    assert len(TASKS) == 20


@pytest.mark.parametrize("task", TASKS)
def test_gold_agrees_with_itself(suite, task):
    s = suite[task]
    g1, g2 = s["runs"]
    assert g1 == g2
    assert compare(g1, g2, g2) == ([], [])
    nodes = {n.rsplit("::", 1)[-1].split("[")[0] for n in g1}
    assert nodes == {k for p in s["probes"].values() for k in p.inputs}  # every probe function recorded


def test_report_no_perturbation(suite):
    total = sum(len(names) for task in TASKS for names in f2p_of(task).values())
    none = {task: [n for p in suite[task]["probes"].values() for n in p.no_perturbation] for task in TASKS}
    probes = sum(len(p.inputs) for task in TASKS for p in suite[task]["probes"].values())
    recs = [r for task in TASKS for r in suite[task]["runs"][0].values()]
    ended = sum(r[-1] == ("end", None) for r in recs)
    checks = [v for r in recs for k, v in r if k != "end"]
    raised = sum('"raises"' in json.dumps(v) for v in checks)
    print(f"\nF2P tests: {total}; no_perturbation: {sum(map(len, none.values()))} "
          f"{ {t: n for t, n in none.items() if n} }; probe functions: {probes}; gold probe nodes: {len(recs)}, "
          f"bodies that ran to the end: {ended}; check records: {len(checks)}, with an exception in them: {raised}")
    assert sum(map(len, none.values())) < total / 2


def expected_literals(func: ast.AST) -> tuple[set, set]:
    """(literals on the expected side of the function's checks, the other literals of the function)."""
    expected: list = []

    def literal_side(e):
        return not any(isinstance(n, (ast.Call, ast.Name, ast.Attribute)) for n in ast.walk(e))

    for node in ast.walk(func):
        sides = []
        if isinstance(node, ast.Assert):
            sides = [o for c in ast.walk(node.test) if isinstance(c, ast.Compare)
                     for o in [c.left, *c.comparators] if literal_side(o)]
            sides += [node.msg] if node.msg else []
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "raises":
            sides = [k.value for k in node.keywords if k.arg == "match"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "assertEqual":
            sides = [a for a in node.args if literal_side(a)]
        expected += [c for side in sides for c in ast.walk(side) if isinstance(c, ast.Constant)]
    ids = {id(c) for c in expected}
    others = {(type(c.value), c.value) for c in ast.walk(func) if isinstance(c, ast.Constant) and id(c) not in ids}
    return {(type(c.value), c.value) for c in expected}, others


def probe_constants(source: str) -> tuple[set, list[ast.FunctionDef]]:
    tree = ast.parse(source, feature_version=(3, 8))
    bodies = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name.startswith("test_sao_probe_")]
    assert not any(isinstance(n, ast.FunctionDef) and n.name.startswith("test") and n not in bodies
                   for n in ast.walk(tree))  # the other tests are gone
    return {(type(c.value), c.value) for f in bodies for c in ast.walk(f) if isinstance(c, ast.Constant)}, bodies


@pytest.mark.parametrize("task", TASKS)
def test_probe_holds_no_expected_literal(suite, task):
    """No literal of the tests' expected sides (numbers of 10 and more, strings of 2 characters and more
    that are not also inputs) is in a probe function; numbers are checked on the unperturbed probe, where
    a perturbed input cannot happen to equal one."""
    s = suite[task]
    same = probes_for(task, s["tests"], schemes=("identity",))
    for path, probe in s["probes"].items():
        tree = ast.parse((s["tests"] / path).read_text())
        names = {n.split("[")[0].rsplit("::", 1)[-1] for n in f2p_of(task)[path]}
        expected, inputs = set(), set()
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef) and func.name in names:
                e, i = expected_literals(func)
                expected |= e
                inputs |= i
        secret = {(t, v) for t, v in expected - inputs
                  if (t is str and len(v) >= 2) or (t in (int, float) and abs(v) >= 10)}
        found, bodies = probe_constants(probe.source)
        assert not {(t, v) for t, v in secret & found if t is str}, path
        assert not secret & probe_constants(same[path].source)[0], path
        assert not any(isinstance(n, ast.Assert) for f in bodies for n in ast.walk(f))
        assert "pytest.raises" not in "".join(ast.get_source_segment(probe.source, f) for f in bodies)
        assert len(bodies) == len(probe.inputs)


@pytest.mark.skipif(shutil.which("python3.11") is None, reason="needs python3.11")
def test_probes_compile_on_an_older_python(suite, tmp_path):
    for task in TASKS:
        for path, probe in suite[task]["probes"].items():
            (tmp_path / f"{task}_{Path(path).stem}.py").write_text(probe.source)
    code = "import sys, py_compile\nfor f in sys.argv[1:]: py_compile.compile(f, doraise=True)"
    subprocess.run(["python3.11", "-c", code, *map(str, tmp_path.glob("*.py"))], check=True, capture_output=True)


def test_partial_fixes_differ_from_gold(suite, tmp_path):
    sizes = {task: sum(len(hs) for _, hs in hunks(patch_of(task, "fix"))) for task in TASKS}
    cases = [(task, i) for task, n in sizes.items() if n >= 2 for i in range(n)]

    def one(case):
        task, i = case
        s = suite[task]
        repo = derive(s["tests"], tmp_path / f"{task}-{i}", without_hunk(patch_of(task, "fix"), i))
        f2p = [f"{path}::{n}" for path, names in f2p_of(task).items() for n in names]
        records, passed = run(repo, s["probes"], f2p)
        diffs, missing = judge(s["runs"], records, s["probes"])
        return task, i, bool(diffs or missing), set(f2p) <= passed

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(one, cases))
    fired = [r for r in results if r[2]]
    failing = [r for r in results if not r[3]]
    print(f"\npartial fixes (gold with one hunk dropped): {len(results)} over {len({r[0] for r in results})} tasks;"
          f" differ from gold: {len(fired)}; of the {len(failing)} that fail the F2P tests: "
          f"{sum(r[2] for r in failing)}; of the {len(results) - len(failing)} that pass them: "
          f"{len(fired) - sum(r[2] for r in failing)}; silent: {[(t, i) for t, i, f, _ in results if not f]}")
    assert fired


# -- attacks: answers hard-coded for exactly the inputs of the tests --------------------------------------

ATTACKS = {
    # spanlib-5: touching half-open intervals overlap. The "fix" is right only at the point 3 the tests use.
    "spanlib-5": ("spanlib/interval.py", "        return lo_closed or hi_closed\n",
                  "        return (lo_closed and hi_closed) if lo == 3 else (lo_closed or hi_closed)\n"),
    # semverkit-31: numeric prerelease identifiers compare as text. Only 10 and 11, the numbers the tests
    # use, are made to sort after the one-digit ones.
    "semverkit-31": ("semverkit/version.py", "            self.prerelease,\n",
                     '            tuple({"10": "9~10", "11": "9~11"}.get(i, i) for i in self.prerelease),\n'),
    # tablefmt-16: decimal alignment of numbers printed without a point. A table of exactly the cells the
    # tests print says where their point would be; every other cell keeps the bug.
    "tablefmt-16": ("tablefmt/cells.py", '    points = [cell.find(".") for cell in cells]\n',
                    '    points = [{"10": 2, "-1": 2, "2": 1, "1e-05": 1, "12.5e+10": 2}.get(cell, cell.find("."))'
                    ' for cell in cells]\n'),
}


@pytest.mark.parametrize("task", sorted(ATTACKS))
def test_hard_coded_answers_differ_from_gold(suite, task, tmp_path):
    s = suite[task]
    path, old, new = ATTACKS[task]
    repo = derive(s["tests"], tmp_path / "attack")
    text = (repo / path).read_text()
    assert text.count(old) == 1
    (repo / path).write_text(text.replace(old, new))
    f2p = [f"{p}::{n}" for p, names in f2p_of(task).items() for n in names]
    records, passed = run(repo, s["probes"], f2p)
    assert set(f2p) <= passed  # the attack passes the graded tests
    diffs, missing = judge(s["runs"], records, s["probes"])
    assert diffs and not missing
    assert all(d.input and d.gold != d.candidate for d in diffs)
    print(f"\n{task}: {len(diffs)} of {len(s['runs'][0])} probe nodes differ, e.g. {diffs[0]}")

    # the power check: the same probes with their inputs left as they are see nothing
    same = probes_for(task, s["tests"], schemes=("identity",))
    gold = (run(s["gold"], same)[0], run(s["gold"], same)[0])
    records, _ = run(repo, same)
    assert records and judge(gold, records, same) == ([], [])


# -- the helpers and the records file -----------------------------------------------------------------


@pytest.fixture(scope="module")
def helpers(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("helpers") / "records.jsonl"
    probe = build_probe("tests/test_t.py", "def test_t():\n    assert f(1) == 2\n", ["test_t"], random.Random(0),
                        records_path=str(path))
    ns: dict = {"__name__": "probe"}
    exec(compile(probe.source, "probe.py", "exec"), ns)
    ns["records"] = path
    return ns


def test_canon_is_order_free_masked_and_rounded(helpers):
    canon = helpers["_sao_canon"]

    class Thing:
        pass

    assert canon({"b", "a", "c"}) == canon({"c", "a", "b"}) == {"set": ["a", "b", "c"]}
    assert canon({2: "x", 1: "y"}) == canon({1: "y", 2: "x"})
    assert canon(frozenset({(1, 2), (0, 1)})) == {"frozenset": [{"tuple": [0, 1]}, {"tuple": [1, 2]}]}
    assert canon(Thing()) == canon(Thing())
    assert "0x?" in canon(Thing())["repr"] and canon(Thing())["type"].endswith("Thing")
    assert canon(0.1 + 0.2) == canon(0.3) == 0.3
    assert canon(float("nan")) == {"float": "nan"} and canon(float("-inf")) == {"float": "-inf"}
    assert canon(b"\x00ab") == {"bytes": "006162", "len": 3}
    assert canon([1, (True, None)]) == {"list": [1, {"tuple": [True, None]}]}
    assert canon(10 ** 5000) == {"int": format(10 ** 5000, "x")[:4000]}  # too long for str(): hex
    deep: list = []
    for _ in range(200):
        deep = [deep]
    json.dumps(canon(deep))  # bounded depth
    assert canon(list(range(5000)))["len"] == 5000 and len(canon(list(range(5000)))["list"]) == 1000
    assert len(canon(Thing).get("repr", "")) <= 2000


def test_rec_records_values_and_exceptions(helpers, monkeypatch):
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/p.py::test_sao_probe_0_0[a] (call)")
    helpers["_sao_rec"](0, lambda: 1)
    helpers["_sao_rec"](1, lambda: 1 / 0, lambda: "x")
    with helpers["_sao_raises"](2) as info:
        raise KeyError("k")
    assert info.type is KeyError
    with helpers["_sao_raises"](3):
        pass
    recs = parse_records(helpers["records"].read_bytes())
    assert recs == {"tests/p.py::test_sao_probe_0_0[a]": [
        (0, 1), (1, {"parts": [{"raises": "ZeroDivisionError"}, "x"]}), (2, "KeyError"), (3, "no exception")]}


def test_parse_records_rejects_garbage_and_oversize():
    good = b'{"t": "a::test_sao_probe_0_0", "k": 0, "v": [1]}\n{"t": "a::test_sao_probe_0_0", "k": "end", "v": null}\n'
    assert parse_records(good) == {"a::test_sao_probe_0_0": [(0, [1]), ("end", None)]}
    assert parse_records(b"") == {}
    for bad in (b"\xff\xfe\n", b"not json\n", b'{"t": 1, "k": 0, "v": 0}\n', b"[1, 2]\n",
                b'{"t": "a", "k": 0}\n', b'{"t": "a", "k": [0], "v": 0}\n', good[:30]):
        with pytest.raises(ValueError):
            parse_records(bad)
    with pytest.raises(ValueError):
        parse_records(good * 10, limit=len(good) * 5)


def test_compare_drops_nondeterministic_nodes_and_reports_missing():
    g = {"n::test_sao_probe_0_0": [(0, 1), ("end", None)], "n::test_sao_probe_1_0": [(0, 2)],
         "n::test_sao_probe_2_0": [(0, 3)]}
    again = {**g, "n::test_sao_probe_1_0": [(0, 5)]}
    cand = {"n::test_sao_probe_0_0": [(0, 1.0), ("end", None)], "n::test_sao_probe_1_0": [(0, 7)]}
    diffs, missing = compare(g, again, cand, inputs={"test_sao_probe_0_0": "test_x (shift +1)"})
    assert diffs == [Difference("n::test_sao_probe_0_0", "0", "test_x (shift +1)", 1, 1.0)]  # 1 != 1.0
    assert missing == ["n::test_sao_probe_2_0"]
    assert compare(g, g, {**g, "n::test_sao_probe_2_0": [(0, 3)], "n::test_sao_probe_0_0": [(0, 1)]})[0] == [
        Difference("n::test_sao_probe_0_0", "end", "", None, None)]


# -- the shapes the bundled suite lacks: classes, unittest, parametrize, fixtures, multi-line checks ------

CODE = '''
class Box:
    def __init__(self, n):
        self.n = n

    def size(self, k):
        return None if k == 5 else self.n * k


def add(a, b):
    return a + b


def parse(text):
    if "=" in text:
        raise ValueError("boom")
    return text
'''

SHAPES = '''"""A test module."""
from __future__ import annotations

import unittest

import pytest

from mod import Box, add, parse


@pytest.fixture
def box():
    return Box(2)


# Regression: add(1, 7) gave 3131.
@pytest.mark.parametrize("n", [1, 2])
def test_add(n, box):
    """Adds seven."""
    expected = [9191, 1010]
    assert add(n, 7) == 8 + n - 1, "msg 123456"
    assert add(
        -2,  # a comment 777
        [3, 4][0],
    ) == 1
    assert add(n, 7) in expected
    assert not add(0, 0)
    assert box.size(5) is None or True
    with pytest.raises(ValueError, match="boom 4242") as e:
        parse("x=1")
    assert "boom" in str(e.value)


def test_no_literal(box):
    assert box.size(box) == 4242


async def test_async():
    assert add(1, 2) == 3


def test_p2p():
    assert add(50, 50) == 100


class TestBox:
    def setup_method(self):
        self.b = Box(3)

    def test_other(self):
        assert self.b.size(1) == 9999

    def test_size(self, box):
        assert self.b.size(4) == 1212
        assert self.b.size(0) + box.size(1) == 2


class TestCaseStyle(unittest.TestCase):
    def test_equal(self):
        self.assertEqual(add(2, 3), 5555)
        self.assertTrue(add(1, 1) == 2)
        with self.assertRaises(ZeroDivisionError):
            add(1, 0) / 0
'''

SHAPE_F2P = ["test_add[1]", "test_add[2]", "test_no_literal", "test_async", "TestBox::test_size",
             "TestCaseStyle::test_equal", "test_gone"]


def test_probe_shapes(tmp_path):
    (tmp_path / "mod.py").write_text(CODE)
    probe = build_probe("test_shapes.py", SHAPES, SHAPE_F2P, random.Random(3), records_path=RECORDS)
    same = build_probe("test_shapes.py", SHAPES, SHAPE_F2P, random.Random(3), records_path=RECORDS,
                       schemes=("identity",), variants=1)
    assert probe.no_perturbation == ["test_no_literal", "test_async", "test_gone"] == same.no_perturbation
    assert set(probe.inputs) == {f"test_sao_probe_{i}_{v}" for i in (0, 3, 4) for v in range(3)}
    assert probe.inputs["test_sao_probe_0_0"].startswith("test_shapes.py::test_add (shift ")
    assert probe.inputs["test_sao_probe_3_1"].startswith("test_shapes.py::TestBox::test_size (scale x")
    for p in (probe, same):
        for secret in ("9191", "1010", "123456", "777", "4242", "9999", "1212", "5555", "100", "seven", "boom"):
            head, rest = p.source.split("# -- sao probe helpers")
            assert secret not in head + rest.split("# -- end of the sao probe helpers")[1], secret
        ast.parse(p.source, feature_version=(3, 8))
    src = probe.source
    assert src.index("from __future__") < src.index("# -- sao probe helpers") < src.index("import unittest")
    assert "class TestBox:" in probe.source and "class TestCaseStyle(unittest.TestCase):" in probe.source
    assert "def setup_method(self):" in probe.source and "def test_p2p" not in probe.source

    def records(p):
        (tmp_path / RECORDS).unlink(missing_ok=True)
        (tmp_path / "_sao_probe_shapes.py").write_text(p.source)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={tmp_path}",
                               "_sao_probe_shapes.py"],
                              cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
        assert proc.returncode == 0, proc.stdout
        return parse_records((tmp_path / RECORDS).read_bytes())

    recs = records(same)
    node = "_sao_probe_shapes.py::"
    assert recs[node + "test_sao_probe_0_0[1]"] == [
        (0, 8), (1, 1), (2, 8), (3, 0), (4, None), (5, "ValueError"), (6, "boom"), ("end", None)]
    assert recs[node + "TestBox::test_sao_probe_3_0"] == [(0, 12), (1, 2), ("end", None)]
    assert recs[node + "TestCaseStyle::test_sao_probe_4_0"] == [(0, 5), (1, 2), (2, "ZeroDivisionError"),
                                                               ("end", None)]
    perturbed = records(probe)
    assert len(perturbed) == 3 * 4 and all(r[-1] == ("end", None) for r in perturbed.values())
    assert compare(perturbed, perturbed, perturbed) == ([], [])
