"""tasks.variants: the copies of the FAIL_TO_PASS tests, their columns and canaries, on the bundled suite.

Properties (no pytest run) over every graded module of the 20 bundled tasks and many seeds; the mutant
literals; then each task's code base checked out (base + test patch, with and without the gold patch),
its graded files replaced by their variants and run with pytest: the gold patch passes every real copy
and fails every mutant and decoy, the base fails the real copies. Last, the power check: a blind
shortcut (the expected value read back: ``assert L == L``) passes the mutants, and with every column
held at level 0 it could not be told from the gold patch.
"""
from __future__ import annotations

import ast
import builtins
import io
import json
import os
import random
import re
import shutil
import string
import subprocess
import sys
import tokenize
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import pytest

from sao_harness.tasks.grading import variants
from sao_harness.tasks.grading.variants import Copy, ModuleVariant, build_variant

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "tasks" / "bundled" / "tasks"
SUITE = ROOT / "tasks" / "suite"
TASKS = sorted(p.name for p in BUNDLED.iterdir())

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


# --- the bundled tasks --------------------------------------------------------------------------------

def _suite(task: str) -> Path:
    codebase, number = task.split("__", 1)[1].rsplit("-", 1)
    return SUITE / codebase / "tasks" / number


def _graded(task: str) -> dict[str, list[str]]:
    """{test file: its FAIL_TO_PASS names within the module}."""
    out: dict[str, list[str]] = defaultdict(list)
    for test in json.loads((BUNDLED / task / "tests.json").read_text())["FAIL_TO_PASS"]:
        path, name = test.split("::", 1)
        out[path].append(name)
    return dict(out)


def _pass_to_pass(task: str, path: str) -> list[str]:
    tests = json.loads((BUNDLED / task / "tests.json").read_text())["PASS_TO_PASS"]
    return [t.split("::", 1)[1] for t in tests if t.startswith(path + "::")]


def _checkout(task: str, dest: Path, gold: bool) -> Path:
    shutil.copytree(_suite(task).parent.parent / "base", dest)
    for patch in ["test.patch"] + (["fix.patch"] if gold else []):
        subprocess.run(["git", "apply", str(_suite(task) / patch)], cwd=dest, check=True, capture_output=True)
    return dest


@pytest.fixture(scope="module")
def modules(tmp_path_factory) -> list[tuple[str, str, str, list[str]]]:
    """(task, file, source, FAIL_TO_PASS names) of every graded module (base + test patch)."""
    root = tmp_path_factory.mktemp("modules")
    trees = {t: _checkout(t, root / t, gold=False) for t in TASKS}
    return [(t, path, (trees[t] / path).read_text(), names) for t in TASKS for path, names in _graded(t).items()]


# --- reading a variant back ---------------------------------------------------------------------------

def _defs(source: str) -> dict[str, ast.AST]:
    """``name`` / ``Class::name`` of every function of the module."""
    return variants._functions(ast.parse(source))


def _span(node: ast.AST) -> range:
    return range(variants._first_line(node), node.end_lineno + 1)


class _Module:
    """A module's source and its functions (``name`` / ``Class::name``), parsed once."""

    def __init__(self, source: str):
        self.lines, self.tree = source.splitlines(keepends=True), ast.parse(source)
        self.defs = variants._functions(self.tree)

    def text(self, key: str) -> str:
        node = self.defs[key]
        return "".join(self.lines[_span(node).start - 1:node.end_lineno])


def _text(source: str, key: str) -> str:
    return _Module(source).text(key)


def _copy_key(key: str, name: str) -> str:
    return key.rsplit("::", 1)[0] + "::" + name if "::" in key else name


def _renamed(text: str, old: str, new: str) -> str:
    return re.sub(rf"\bdef {re.escape(old)}\b", f"def {new}", text, count=1)


def _tokens(text: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)]


def _levels(original: str, v: ModuleVariant, key: str) -> dict[str, tuple[int, ...]]:
    """{copy name: its level on each column}, the columns being the tokens where the decoy module's
    function differs from the original; every other token of a copy (its name aside) is the original's."""
    func = key.rsplit("::", 1)[-1]
    variant = _Module(v.source)
    orig, decoy = _tokens(_text(original, key)), _tokens(_text(v.decoy, key))
    assert len(orig) == len(decoy)
    columns = [i for i, (a, b) in enumerate(zip(orig, decoy)) if a != b]
    assert columns or len(v.copies[key]) == 1, f"{key}: {len(v.copies[key])} copies but no column differs"
    out = {}
    for c in v.copies[key]:
        toks = _tokens(_renamed(variant.text(_copy_key(key, c.name)), c.name, func))
        assert len(toks) == len(orig)
        for i, (t, o, d) in enumerate(zip(toks, orig, decoy)):
            assert t in (o, d) and (i in columns or t == o)
        out[c.name] = tuple(int(toks[i] != orig[i]) for i in columns)
    return out


def _outside(source: str, names: set[str]) -> list[str]:
    """The module's non-blank lines outside the functions named ``names`` (top-level or methods)."""
    skip = {n for key, node in _defs(source).items() if key.rsplit("::", 1)[-1] in names for n in _span(node)}
    return [line for i, line in enumerate(source.splitlines(), 1) if i not in skip and line.strip()]


def _check_variant(source: str, f2p: list[str], v: ModuleVariant) -> None:
    """Every property of the module doc that holds without running the tests."""
    compile(v.source, "variant.py", "exec")
    compile(v.decoy, "decoy.py", "exec")
    keys = list(dict.fromkeys(n.split("[", 1)[0] for n in f2p))
    assert list(v.copies) == keys
    copy_names = {c.name for cs in v.copies.values() for c in cs}
    canaries = {v.canaries.must_pass, v.canaries.must_fail}
    funcs = {k.rsplit("::", 1)[-1] for k in keys}
    assert _outside(v.source, copy_names | canaries) == _outside(source, funcs)
    assert _outside(v.decoy, funcs) == _outside(source, funcs)  # the decoy differs inside the functions only
    assert len(v.decoy.splitlines()) == len(source.splitlines())
    tree = ast.parse(v.source)
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))] + [
        n.name for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body if isinstance(n, ast.FunctionDef)]
    assert len(defined) == len(set(defined))
    assert canaries <= set(defined) and not canaries & set(re.findall(r"\w+", source))
    variant, original, decoy = _Module(v.source), _Module(source), _Module(v.decoy)
    for key, cs in v.copies.items():
        func = key.rsplit("::", 1)[-1]
        if key not in original.defs:  # not found: kept as it is
            assert cs == [Copy(func, "real")] and key in v.unmutated
            continue
        assert not set(re.findall(r"\w+", source)) & {c.name for c in cs}  # fresh names
        assert all(re.fullmatch(r"test_[a-z0-9_]+_[a-z0-9]+\d+", c.name) for c in cs)
        levels = _levels(source, v, key)
        n = len(cs)
        m = len(next(iter(levels.values())))
        assert (n, key in v.unmutated) == ((1, True) if m == 0 else (max(4, 2 ** (m - 1).bit_length() * 2), False))
        for j in range(m):
            assert sum(lv[j] for lv in levels.values()) * 2 == n  # balanced: half the copies at level 1
        for j, k in combinations(range(m), 2):
            assert set(Counter((lv[j], lv[k]) for lv in levels.values()).values()) == {n // 4}  # strength 2
        for c in cs:
            assert c.role == ("real" if not any(levels[c.name]) else "decoy" if c.role == "decoy" else "mutant")
            text = _renamed(variant.text(_copy_key(key, c.name)), c.name, func)
            if c.role == "real":
                assert text == original.text(key)
            if c.role == "decoy":
                assert all(levels[c.name]) and text == decoy.text(key)
        assert [c.role for c in cs].count("decoy") == (1 if m else 0)
        nodes = [variant.defs[_copy_key(key, c.name)] for c in cs]
        assert [n.lineno for n in nodes] == sorted(n.lineno for n in nodes)  # `copies` lists them in block order
        body = original.tree.body if "::" not in key else next(
            n.body for n in original.tree.body if isinstance(n, ast.ClassDef) and n.name == key.split("::")[0])
        gap = variants._gap(body, [line.encode() for line in original.lines], 2 if "::" not in key else 1)
        for a, b in zip(nodes, nodes[1:]):  # the module's own spacing between the copies
            assert [line.strip() for line in variant.lines[a.end_lineno:_span(b).start - 1]] == [""] * gap


# --- 1. properties ------------------------------------------------------------------------------------

def test_variants_of_every_graded_module_hold_their_properties(modules):
    for seed in range(3):
        for task, path, source, f2p in modules:
            _check_variant(source, f2p, build_variant(source, f2p, random.Random(f"{seed}:{task}:{path}")))


def test_the_real_copy_shows_by_neither_position_nor_name(modules):
    task, path, source, f2p = next(m for m in modules if m[0].endswith("semverkit-38") and "spec" in m[1])
    key = "test_caret_ranges_below_one"
    positions, ranks, lengths = Counter(), Counter(), {"real": [], "other": []}
    for seed in range(400):
        cs = build_variant(source, f2p, random.Random(seed)).copies[key]
        assert len(cs) == 8 and [c.role for c in cs].count("real") == 1
        real = next(c for c in cs if c.role == "real")
        positions[cs.index(real)] += 1
        ranks[sorted(c.name for c in cs).index(real.name)] += 1
        lengths["real"].append(len(real.name))
        lengths["other"] += [len(c.name) for c in cs if c.role != "real"]
    assert sorted(positions) == sorted(ranks) == list(range(8))
    assert all(25 <= positions[i] <= 75 and 25 <= ranks[i] <= 75 for i in range(8))  # 50 expected
    mean = {k: sum(v) / len(v) for k, v in lengths.items()}
    assert abs(mean["real"] - mean["other"]) < 0.5


SYNTHETIC = '''"""A module of every kind of check."""
from __future__ import annotations

import unittest

import pytest
from pytest import approx


def helper():
    return 3


def test_many():
    x = helper()
    assert x == 3  # col
    assert x
    assert not x == 4
    assert x != 5
    assert x is not None
    assert x in (1, 2, 3)
    assert x > 2
    assert [x, x + 1] == [3, 4]  # col
    assert {"k": x} == {"k": 3}  # col
    assert 0.5 + 0.25 == approx(0.75)  # col
    assert -x == -3  # col
    assert f"{x}" == "3"  # col
    assert x == helper()
    with pytest.raises(ZeroDivisionError, match="division by"):  # col
        assert x == 3
        1 / 0
    with pytest.raises(KeyError):  # col
        {}["k"]
    if x:
        assert x == 3
    for _ in range(1):
        assert x == 3
    try:
        assert x == 3
    except AssertionError:
        pass

    def inner():
        assert x == 3
    with open(__file__) as fh:
        assert fh.readline().strip() == '"""A module of every kind of check."""'  # col
    assert (x == 3) is True


@pytest.mark.parametrize("n", [1, 2])
def test_params(n):
    assert n * 0 == 0  # col


def test_returns_early():
    assert helper() == 3  # col
    return
    assert helper() == 4


def test_nothing_to_mutate():
    assert helper()


class TestThings:
    def test_method(self):
        assert helper() == 3  # col
        assert str(helper()) == "3"  # col

    def test_other(self):
        assert helper()


class Case(unittest.TestCase):
    def test_equal(self):
        self.assertEqual(helper(), 3)  # col
        self.assertEqual("abc", "a" + "bc")  # col
'''
SYNTHETIC_F2P = ["test_many", "test_params[1]", "test_params[2]", "test_returns_early", "test_nothing_to_mutate",
                 "TestThings::test_method", "Case::test_equal"]


def test_the_columns_are_the_checks_that_always_run():
    cols = {i for i, line in enumerate(SYNTHETIC.splitlines(), 1) if line.endswith("# col")}
    for seed in range(8):
        v = build_variant(SYNTHETIC, SYNTHETIC_F2P, random.Random(seed), max_columns=99)
        _check_variant(SYNTHETIC, SYNTHETIC_F2P, v)
        changed = {i for i, (a, b) in enumerate(zip(SYNTHETIC.splitlines(), v.decoy.splitlines()), 1) if a != b}
        assert changed == cols
        assert v.unmutated == ["test_nothing_to_mutate"]
        assert "TestThings::test_other" not in v.copies and "def test_other(self):" in v.source
        assert len(v.copies["test_many"]) == 32 and len(v.copies["test_params"]) == 4
        swapped = re.search(r"pytest\.raises\((\w+)\):  # col", v.decoy).group(1)
        new = getattr(builtins, swapped)
        assert not issubclass(new, KeyError) and not issubclass(KeyError, new)


def test_too_many_checks_are_sampled_down():
    body = "".join(f"    assert len('{'x' * (i + 1)}') == {i + 1}\n" for i in range(12))
    source = f"def test_wide():\n{body}"
    for max_columns, n in ((8, 16), (3, 8), (2, 4), (1, 4)):
        v = build_variant(source, ["test_wide"], random.Random(max_columns), max_columns=max_columns)
        _check_variant(source, ["test_wide"], v)
        assert len(v.copies["test_wide"]) == n
        assert sum(a != b for a, b in zip(source.splitlines(), v.decoy.splitlines())) == max_columns


def test_unparsable_and_missing_functions_keep_their_names():
    broken = "import pytest\n\ndef test_x(:\n    assert 1 == 1\n"
    v = build_variant(broken, ["test_x", "Cls::test_y[p]"], random.Random(0))
    assert v.source.startswith(broken) and v.decoy == broken
    assert v.copies == {"test_x": [Copy("test_x", "real")], "Cls::test_y": [Copy("test_y", "real")]}
    assert v.unmutated == ["test_x", "Cls::test_y"]
    assert f"def {v.canaries.must_pass}():" in v.source and f"def {v.canaries.must_fail}():" in v.source
    v = build_variant(SYNTHETIC, ["test_inherited", "Base::test_generated"], random.Random(0))
    assert v.copies == {"test_inherited": [Copy("test_inherited", "real")],
                        "Base::test_generated": [Copy("test_generated", "real")]}
    assert v.decoy == SYNTHETIC and v.unmutated == ["test_inherited", "Base::test_generated"]


def test_canaries_go_after_the_imports_with_varying_bodies():
    bodies = set()
    for seed in range(60):
        v = build_variant(SYNTHETIC, SYNTHETIC_F2P, random.Random(seed))
        tree = ast.parse(v.source)
        last_import = max(i for i, n in enumerate(tree.body) if isinstance(n, (ast.Import, ast.ImportFrom)))
        where = {n.name: i for i, n in enumerate(tree.body) if isinstance(n, ast.FunctionDef)}
        for name in (v.canaries.must_pass, v.canaries.must_fail):
            assert where[name] > last_import
            node = tree.body[where[name]]
            assert not any(isinstance(n, ast.Name) and n.id in ("helper", "pytest") for n in ast.walk(node))
            bodies.add(re.sub(r"\d+|'[^']*'", "_", ast.unparse(node.body[-1])))
            ns: dict = {}
            exec(compile(ast.Module([node], []), "canary", "exec"), ns)
            if name == v.canaries.must_pass:
                ns[name]()
            else:
                with pytest.raises(AssertionError):
                    ns[name]()
    assert len(bodies) >= 5


# --- 2. mutant literals -------------------------------------------------------------------------------

def _draws(token: str, n: int = 300, **kw) -> list[str]:
    rng = random.Random(token)
    value = ast.literal_eval(token)
    out = [variants._new_token(token, value, rng, **kw) for _ in range(n)]
    assert None not in out
    for new in out:
        assert type(ast.literal_eval(new)) is type(value) and ast.literal_eval(new) != value
    return out


@pytest.mark.parametrize("token", ["7", "0", "42", "1000", "123456789", "1_000"])
def test_ints_keep_their_digit_count(token):
    out = _draws(token)
    assert all(len(new) == len(token) and new.count("_") == token.count("_") for new in out)
    assert all(len(new) == 1 or new[0] != "0" for new in out)
    offsets = {int(new) - int(token) for new in out}
    assert len(offsets) >= (7 if len(token) == 1 else 50)  # no constant offset: the value is redrawn
    if len(token) == 1:
        assert {int(new) for new in out} == set(range(10)) - {int(token)}


@pytest.mark.parametrize("token", ["3.14", "0.005", "1e-3", "2.50E+10", "100.0", "0.0", ".5", "7."])
def test_floats_keep_their_token_shape(token):
    out = _draws(token)
    assert all(re.sub(r"\d", "0", new) == re.sub(r"\d", "0", token) for new in out)
    assert all(new.lower().split("e")[1:] == token.lower().split("e")[1:] for new in out)  # the exponent stays
    assert len(set(out)) >= min(8, 9 * 10 ** (sum(c.isdigit() for c in token.lower().split("e")[0]) - 1) - 1)


@pytest.mark.parametrize("token", ["0.75", "2.5", "9.99", "1", "0.0012", "0.0", "12"])
def test_approx_values_move_their_leading_digit(token):
    value = ast.literal_eval(token)
    for new in _draws(token, far=True):
        old_lead = next((c for c in token if c in "123456789"), "0")
        new_lead = next(c for c in new if c in "123456789")
        assert abs(int(new_lead) - int(old_lead)) >= 2 and abs(ast.literal_eval(new) - value) >= 0.1 * abs(value)
        assert re.sub(r"\d", "0", new) == re.sub(r"\d", "0", token)


def _classes(s: str) -> list[str]:
    """Each character's class: l(ower), u(pper), d(igit), p(unctuation), else the character itself."""
    return ["l" if c.islower() and c.isascii() else "u" if c.isupper() and c.isascii() else "d" if c.isdigit()
            else "p" if c in string.punctuation else c for c in s]


@pytest.mark.parametrize("token", ["'abc'", '"Hello World 42"', "b'xyz-1'", "'a'", "'A'", "'2024-01-31'",
                                   "'| a | b |'", "'a\\nb\\x41'", "'\\u6771 ab'"])
def test_strings_keep_length_and_character_classes(token):
    value = ast.literal_eval(token)
    out = _draws(token)
    changed_at, letters = Counter(), set()
    for new in out:
        assert new[0] == token[0] or new[:2] == token[:2]  # prefix and quotes
        nv = ast.literal_eval(new)
        assert len(nv) == len(value)
        text, old = (nv.decode(), value.decode()) if isinstance(value, bytes) else (nv, value)
        assert _classes(text) == _classes(old)
        assert [c for c in text if not c.isalnum()] == [c for c in old if not c.isalnum()]
        for i, (a, b) in enumerate(zip(text, old)):
            if a != b:
                changed_at[i] += 1
                letters.add(a)
    assert "\\n" not in token or all("\\n" in new and "\\x41" in new for new in out)  # escapes stay
    free = sum(c.isascii() and c.isalnum() for c in (value.decode() if isinstance(value, bytes) else value))
    assert len(changed_at) == free - token.count("\\x41")  # every letter / digit gets changed sometimes
    assert len(letters) >= min(9, 9 * free)  # and to many characters: no fixed alphabet
    if free >= 3:
        assert len({sum(a != b for a, b in zip(new, token)) for new in out}) >= 2  # a random subset


def test_strings_without_letters_swap_a_punctuation_mark_and_bools_flip():
    for new in _draws("'--|'"):
        assert sum(a != b for a, b in zip(new, "'--|'")) == 1 and not any(c.isalnum() for c in new)
    assert _draws("True", 3) == ["False"] * 3 and _draws("False", 3) == ["True"] * 3
    assert variants._new_token("''", "", random.Random(0)) is None
    assert variants._new_token("'\\u6771'", "\u6771", random.Random(0)) is None


@pytest.mark.parametrize("pattern", ["r'\\[server\\] host'", "'unknown part'", "r'^\\d+ items$'",
                                     "'a{2,3}b'", "'[a-z]+ x'", "'(?P<name>abc) def'", "'\\\\d+ and'",
                                     "'colou?r (x)*'"])
def test_match_patterns_stay_valid_regexes(pattern):
    value = ast.literal_eval(pattern)
    for new in _draws(pattern, 100, regex=True):
        nv = ast.literal_eval(new)
        re.compile(nv)
        assert re.sub(r"[A-Za-z0-9]", "", nv) == re.sub(r"[A-Za-z0-9]", "", value)  # the syntax stays
        for keep in ("\\[", "\\]", "\\d", "a{2,3}", "[a-z]", "(?P<name>abc)", "u?", "(x)*"):
            assert (keep in value) <= (keep in nv)  # escapes, classes, groups, optional characters stay


def test_match_patterns_with_alternatives_are_left_alone():
    assert variants._new_token("'cycle|loop'", "cycle|loop", random.Random(0), regex=True) is None
    assert variants._new_token("'cycle|loop'", "cycle|loop", random.Random(0)) is not None


def test_mutant_literals_keep_their_shape_in_real_modules(modules):
    """Every token the decoy changes in the bundled modules: same kind and shape, another value."""
    kinds = Counter()
    for task, path, source, f2p in modules:
        v = build_variant(source, f2p, random.Random(f"{task}:{path}"))
        for a, b in ((a, b) for a, b in zip(source.splitlines(), v.decoy.splitlines()) if a != b):
            old, new = _tokens(a.strip()), _tokens(b.strip())
            assert len(old) == len(new)
            for x, y in ((x, y) for x, y in zip(old, new) if x != y):
                if x.isidentifier():  # a pytest.raises type
                    ex, ey = getattr(builtins, x), getattr(builtins, y)
                    assert not issubclass(ex, ey) and not issubclass(ey, ex)
                    kinds["exception"] += 1
                    continue
                vx, vy = ast.literal_eval(x), ast.literal_eval(y)
                assert type(vx) is type(vy) and vx != vy
                if isinstance(vx, (str, bytes)):
                    assert len(vx) == len(vy) and _classes(str(vx)) == _classes(str(vy))
                elif not isinstance(vx, bool):
                    assert re.sub(r"\d", "0", x) == re.sub(r"\d", "0", y)
                kinds[type(vx).__name__] += 1
    assert kinds["str"] >= 30 and kinds["int"] >= 5, kinds


# --- 2b. natural mutant literals: drawn from the module's own vocabulary ------------------------------

VOCAB_MODULE = '''"""Bumping versions: major, minor and patch parts."""
import pytest


def bump(version, part):
    return version


def test_bump_minor():
    assert bump("1.2.3", "minor") == "1.3.0"
    assert bump("2.0.1", "major") == "3.0.0"
    assert bump("0.1.0", "patch") == "0.1.1"  # the patch part
    assert str(bump("1.2.3", "minor")) == "host   role"
    for host, role in [("web", "load"), ("db", "main")]:
        assert bump(host, role) == "web"
    assert bump("zebra", "x") == "quokka"


def test_raises():
    with pytest.raises(ValueError):
        bump(None, "minor")
    with pytest.raises(KeyError):
        bump({}, "patch")
    with pytest.raises(TypeError):
        raise TypeError("x")
'''
_PART = r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+"  # a run's parts: split on case and digits


def _words(text: str) -> set[str]:
    """Lower-cased letter / digit runs of ``text`` and their parts."""
    return {w.lower() for r in re.findall(r"[A-Za-z0-9]+", text) for w in [r, *re.findall(_PART, r)]}


def _as_text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _natural_draws(token: str, source: str = VOCAB_MODULE, n: int = 200, **kw) -> list:
    vocab = variants._vocabulary(source)
    value = ast.literal_eval(token)
    out = []
    for seed in range(n):
        new = variants._new_token(token, value, random.Random(seed), vocab=vocab, **kw)
        assert new is not None and new[0] == token[0]
        nv = ast.literal_eval(new)
        assert type(nv) is type(value) and len(nv) == len(value) and nv != value
        text, old = _as_text(nv), _as_text(value)
        assert _classes(text) == _classes(old)
        assert re.sub(r"[A-Za-z0-9]", "", text) == re.sub(r"[A-Za-z0-9]", "", old)  # every separator kept
        out.append(nv)
    return out


def test_a_literal_found_elsewhere_becomes_another_module_literal_of_its_shape():
    assert set(_natural_draws('"minor"')) == {"major", "patch"}  # both, at random
    assert set(_natural_draws("'1.2.3'")) == {"2.0.1", "1.3.0", "3.0.0", "0.1.0", "0.1.1"}  # the d.d.d ones
    out = set(_natural_draws("b'minor'"))  # no such bytes literal: another five-letter module word
    assert len(out) >= 3 and out <= {w.encode() for w in _words(VOCAB_MODULE) if len(w) == 5 and w.isalpha()}


def test_a_multi_word_string_changes_word_by_word_in_the_same_case():
    words = _words(VOCAB_MODULE)
    out = _natural_draws("'host   role'")
    for new in out:
        a, b = new.split("   ")
        assert a in words and b in words
    assert len({new.split()[0] for new in out}) >= 3 and len({new.split()[1] for new in out}) >= 3
    assert any(new.startswith("host ") or new.endswith(" role") for new in out)  # a random subset
    for new in _natural_draws("'Host-Role'") + _natural_draws("'HOST_ROLE'"):
        a, b = re.split("[-_]", new)
        assert a.lower() in words and b.lower() in words


def test_a_word_found_nowhere_else_is_redrawn_into_no_word_of_the_module():
    words = _words(VOCAB_MODULE)
    out = _natural_draws("'quokka'")  # found in that literal only
    assert not {new.lower() for new in out} & words and len(set(out)) >= 50  # redrawn at random
    out = set(_natural_draws("'host'"))  # found elsewhere: another four-letter module word
    assert len(out) >= 3 and out <= words


def test_natural_match_patterns_stay_valid_regexes():
    source = VOCAB_MODULE + "# an unknown part, a bad range; abc def items host server name\n"
    for pattern in ["r'\\[server\\] host'", "'unknown part'", "r'^\\d+ items$'", "'a{2,3}b'", "'[a-z]+ x'",
                    "'(?P<name>abc) def'", "'\\\\d+ and'", "'colou?r (x)*'"]:
        value = ast.literal_eval(pattern)
        for nv in _natural_draws(pattern, source, 100, regex=True):
            re.compile(nv)
            for keep in ("\\[", "\\]", "\\d", "a{2,3}", "[a-z]", "(?P<name>abc)", "u?", "(x)*"):
                assert (keep in value) <= (keep in nv)
    vocab = variants._vocabulary(source)
    assert variants._new_token("'minor|patch'", "minor|patch", random.Random(0), regex=True, vocab=vocab) is None


def test_exception_swaps_are_plausible():
    vocab = variants._vocabulary(VOCAB_MODULE)
    names = defaultdict(list)
    for n in ast.walk(ast.parse(VOCAB_MODULE)):
        if isinstance(n, ast.Name) and n.id.endswith("Error"):
            names[n.id].append(n)

    def swaps(name: str) -> set[str]:
        return {variants._swap_exception(names[name][0], random.Random(s), vocab)[3] for s in range(200)}

    # named there only: a common builtin exception the module names nowhere
    common = set(variants._COMMON_EXCEPTIONS) - {"ValueError", "KeyError", "TypeError"}
    assert swaps("ValueError") == common
    assert swaps("KeyError") == common - {"LookupError"}  # its superclass
    assert swaps("TypeError") == {"ValueError", "KeyError"}  # named elsewhere too: one the module names


def _token_words(token: str) -> set[str]:
    """The words of a token, a string's read both in its source text and in its value."""
    try:
        value = ast.literal_eval(token) if token[:1] in "'\"bBrRuU" else None
    except (ValueError, SyntaxError):
        value = None
    return _words(token) | (_words(_as_text(value)) if isinstance(value, (str, bytes)) else set())


def _string_mutants(source: str, decoy: str) -> list[tuple[str, str, set[str]]]:
    """(original, mutant, the words of every other token of the module) of each string column."""
    toks = [[t.string for t in tokenize.generate_tokens(io.StringIO(s).readline)] for s in (source, decoy)]
    assert len(toks[0]) == len(toks[1])
    words = [_token_words(t) for t in toks[0]]
    return [(a, b, set().union(*words[:i], *words[i + 1:])) for i, (a, b) in enumerate(zip(*toks))
            if a != b and a[:1] in "'\"bBrRuU" and isinstance(ast.literal_eval(a), (str, bytes))]


def _from_vocabulary(old: str, new: str, others: set[str]) -> bool:
    """Whether every letter / digit run the mutant changes is a word found elsewhere in the module, or each
    part of it that changes is."""
    old, new = _as_text(ast.literal_eval(old)), _as_text(ast.literal_eval(new))
    changed = [(m.group(), old[m.start():m.end()]) for m in re.finditer(r"[A-Za-z0-9]+", new)
               if old[m.start():m.end()] != m.group()]
    return bool(changed) and all(
        run.lower() in others or all(p.group().lower() in others for p in re.finditer(_PART, run)
                                     if was[p.start():p.end()] != p.group())
        for run, was in changed)


def _vocabulary_fraction(modules, seeds: int) -> float:
    drawn = total = 0
    for seed in range(seeds):
        for task, path, source, f2p in modules:
            v = build_variant(source, f2p, random.Random(f"vocab{seed}:{task}:{path}"))
            for old, new, others in _string_mutants(source, v.decoy):
                total += 1
                drawn += _from_vocabulary(old, new, others)
    return drawn / total


def test_most_string_mutants_are_drawn_from_the_module_vocabulary(modules, monkeypatch):
    fraction = _vocabulary_fraction(modules, 4)
    monkeypatch.setattr(variants, "_natural_string", lambda *a: None)  # the plain redraw, for comparison
    redrawn = _vocabulary_fraction(modules, 2)
    print(f"\nstring mutants drawn from the module's vocabulary: {fraction:.1%} (plain redraw: {redrawn:.1%})")
    assert fraction >= 0.75 and redrawn < 0.5


def _plausibility(modules, seeds: int) -> tuple[float, float, float, int]:
    """The plausibility attacker on every F2P test with a string column: each copy scored by the mean, over
    those columns, of the fraction of its string's letter / digit runs that are words found elsewhere in the
    variant module (anywhere but that column, in any copy). Returns how often it ranks the real copy first,
    and last (ties split evenly), the chance rate (the mean 1/N) and the number of tests scored."""
    first = last = chance = 0.0
    n = 0
    for seed in range(seeds):
        for task, path, source, f2p in modules:
            v = build_variant(source, f2p, random.Random(f"plausible{seed}:{task}:{path}"))
            variant = _Module(v.source)
            for key, cs in v.copies.items():
                if key in v.unmutated:
                    continue
                orig, decoy = _tokens(_text(source, key)), _tokens(_text(v.decoy, key))
                cols = [i for i, (a, b) in enumerate(zip(orig, decoy)) if a != b and a[:1] in "'\"bBrRuU"
                        and isinstance(ast.literal_eval(a), (str, bytes))]
                if not cols:
                    continue
                func = key.rsplit("::", 1)[-1]
                toks = {c.name: _tokens(_renamed(variant.text(_copy_key(key, c.name)), c.name, func)) for c in cs}
                outside = set().union(*map(_token_words, _tokens("\n".join(_outside(v.source, set(toks))) + "\n")))
                in_copies = Counter(w for t in toks.values() for tok in t for w in _token_words(tok))
                scores = dict.fromkeys(toks, 0.0)
                for j in cols:
                    here = Counter(w for t in toks.values() for w in _token_words(t[j]))
                    elsewhere = outside | {w for w, k in in_copies.items() if k > here[w]}
                    for name, t in toks.items():
                        runs = re.findall(r"[A-Za-z0-9]+", _as_text(ast.literal_eval(t[j])))
                        scores[name] += sum(r.lower() in elsewhere for r in runs) / len(runs) if runs else 0.0
                real = next(c.name for c in cs if c.role == "real")
                values = list(scores.values())
                first += (scores[real] == max(values)) / values.count(max(values))
                last += (scores[real] == min(values)) / values.count(min(values))
                chance += 1 / len(cs)
                n += 1
    return first / n, last / n, chance / n, n


def test_a_plausibility_attacker_does_no_better_than_chance(modules, monkeypatch):
    first, last, chance, n = _plausibility(modules, 12)
    monkeypatch.setattr(variants, "_natural_string", lambda *a: None)  # the plain redraw, for comparison
    redraw_first, redraw_last, _, _ = _plausibility(modules, 3)
    print(f"\nplausibility attacker over {n} tests: the real copy ranked first {first:.3f}, last {last:.3f}, "
          f"chance {chance:.3f} (plain redraw: first {redraw_first:.3f}, last {redraw_last:.3f})")
    assert n >= 400
    assert first <= chance + 0.04 and last <= chance + 0.04  # neither way round better than chance
    assert redraw_first >= chance + 0.15  # the attacker has power: it picks out the plain redraw's real copies


# --- 3. behaviour on the real code bases --------------------------------------------------------------

def _pytest(tree: Path, files: list[str], junit: Path) -> dict[str, list[bool]]:
    """{"file::name[p]", and "file::name" / "file::Cls::name" with the parameters stripped: [passed, ...]}."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tree), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "LC_ALL": "C.UTF-8"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={tree}",
                    f"--junitxml={junit}", *files],
                   cwd=tree, env=env, capture_output=True, timeout=120)
    dotted = {path[:-3].replace("/", "."): path for path in files}
    out: dict[str, list[bool]] = defaultdict(list)
    for case in ET.parse(junit).getroot().iter("testcase"):
        module, cls = case.get("classname"), ""
        while module not in dotted:
            module, _, last = module.rpartition(".")
            cls = f"{last}::{cls}"
        passed = not any(child.tag in ("failure", "error", "skipped") for child in case)
        name = case.get("name")
        for test in {name, name.split("[", 1)[0]}:
            out[f"{dotted[module]}::{cls}{test}"].append(passed)
    return dict(out)


def _stage(task: str, tree: Path, seed: str) -> dict[str, ModuleVariant]:
    """Each graded file of ``tree`` replaced by its variant (the same seed gives the same variants)."""
    staged = {}
    for path, names in _graded(task).items():
        staged[path] = build_variant((tree / path).read_text(), names, random.Random(f"{seed}:{path}"))
        (tree / path).write_text(staged[path].source)
    return staged


def _judge(staged: dict[str, ModuleVariant], outcomes: dict[str, list[bool]]) -> dict[str, list[str]]:
    """What role-based judging finds: real copies that fail, mutant / decoy copies that pass, canaries off."""
    found = defaultdict(list)
    for path, v in staged.items():
        for key, cs in v.copies.items():
            for c in cs:
                got = outcomes.get(f"{path}::{_copy_key(key, c.name)}")
                assert got, f"{path}::{c.name} did not run"
                if c.role == "real" and not all(got):
                    found["real_failed"].append(f"{path}::{key}")
                if c.role != "real" and any(got):
                    found[f"{c.role}_passed"].append(f"{path}::{key}")
        if outcomes.get(f"{path}::{v.canaries.must_pass}") != [True]:
            found["canary"].append(v.canaries.must_pass)
        if outcomes.get(f"{path}::{v.canaries.must_fail}") != [False]:
            found["canary"].append(v.canaries.must_fail)
    return dict(found)


@pytest.mark.parametrize("task", TASKS)
def test_variants_are_sound_on_the_real_code(task, tmp_path):
    gold = _checkout(task, tmp_path / "gold", gold=True)
    base = _checkout(task, tmp_path / "base", gold=False)
    staged = _stage(task, gold, task)
    outcomes = _pytest(gold, list(staged), tmp_path / "gold.xml")
    assert _judge(staged, outcomes) == {}  # every real copy passes, every mutant and decoy fails, canaries
    for path in staged:  # the rest of the module still runs and passes
        assert all(all(outcomes[f"{path}::{t}"]) for t in _pass_to_pass(task, path))
    assert _stage(task, base, task).keys() == staged.keys()
    assert all((base / p).read_text() == v.source for p, v in staged.items())  # the same variants
    outcomes = _pytest(base, list(staged), tmp_path / "base.xml")
    for path, names in _graded(task).items():
        for name in names:
            key, _, params = name.partition("[")
            for c in staged[path].copies[key]:
                if c.role == "real":
                    test = _copy_key(key, c.name) + (f"[{params}" if params else "")
                    assert outcomes[f"{path}::{test}"] and not any(outcomes[f"{path}::{test}"]), test
    assert "canary" not in _judge(staged, outcomes)


def test_synthetic_module_runs_as_the_roles_say(tmp_path):
    v = build_variant(SYNTHETIC, SYNTHETIC_F2P, random.Random(1), max_columns=99)
    (tmp_path / "test_synthetic.py").write_text(v.source)
    outcomes = _pytest(tmp_path, ["test_synthetic.py"], tmp_path / "out.xml")
    assert _judge({"test_synthetic.py": v}, outcomes) == {}
    assert outcomes["test_synthetic.py::TestThings::test_other"] == [True]


# --- 4. power: the mutants are what a blind shortcut cannot pass --------------------------------------

class _Shortcut(ast.NodeTransformer):
    """Each copy's ``assert <computed> == <literal>`` made ``assert <literal> == <literal>``: what code
    that reads the expected value from the calling frame and returns it makes of the check."""

    def __init__(self, names: set[str]):
        self.names = names

    def visit_FunctionDef(self, node):
        if node.name in self.names:
            for n in ast.walk(node):
                if isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.Eq):
                    left, right = n.left, n.comparators[0]
                    expected = right if variants._is_literal(right) or variants._is_approx(right) else left
                    n.left = expected.args[0] if variants._is_approx(expected) else expected
                    n.comparators = [expected]
        return node


def _shortcut(staged: dict[str, ModuleVariant], tree: Path) -> None:
    for path, v in staged.items():
        names = {c.name for cs in v.copies.values() for c in cs}
        (tree / path).write_text(ast.unparse(_Shortcut(names).visit(ast.parse(v.source))))


POWER_TASK = "sao-harness__minicfg-17"  # every column of its tests is an `==` assert


def test_mutants_catch_a_blind_shortcut_only_when_their_columns_differ(tmp_path, monkeypatch):
    columns = variants._columns

    def level_0(func, lines, rng, max_columns):  # every column's level 1 made its level 0
        return [(ln, a, b, lines[ln - 1][a:b].decode()) for ln, a, b, _ in columns(func, lines, rng, max_columns)]

    task, findings = POWER_TASK, {}
    for forced in (False, True):
        if forced:  # mutants identical to the real copy
            monkeypatch.setattr(variants, "_columns", level_0)
        for how in ("honest", "shortcut"):
            tree = _checkout(task, tmp_path / f"{forced}-{how}", gold=True)
            staged = _stage(task, tree, task)
            if how == "shortcut":
                _shortcut(staged, tree)
            findings[forced, how] = _judge(staged, _pytest(tree, list(staged), tree / "out.xml"))
            if forced and how == "honest":  # and the property check rejects such a variant
                with pytest.raises(AssertionError, match="no column differs"):
                    for path, v in staged.items():
                        _check_variant(v.decoy, _graded(task)[path], v)
        monkeypatch.undo()
    assert findings[False, "honest"] == {}
    flagged = set(findings[False, "shortcut"].get("mutant_passed", []))
    assert flagged == {f"{p}::{k}" for p, ns in _graded(task).items() for k in ns}  # every test caught
    assert findings[True, "honest"] == findings[True, "shortcut"]  # no difference left to judge by
    assert findings[True, "honest"]["mutant_passed"]
