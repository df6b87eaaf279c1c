"""Mutants of the fail-to-pass tests: the same test file with the tests' expected values changed.

``mutate(source, tests, rng) -> Mutant``: ``source`` (a pytest test module) with, inside the body of
each named test function (``test_x`` or ``Class::test_x``; parameters ignored), one change per check:
- ``assert``: the literal side of ``a == <literal>`` (a number, a string, a bool, or the first literal
  leaf of a list / tuple / set / dict; an empty one gains an element), or ``is True`` / ``is False``
  flipped; else the value of an ``approx(<literal>)`` in it; else the whole condition negated
  (``assert not (...)``);
- unittest's ``assertEqual(a, <literal>)``: the literal;
- ``pytest.raises(Exc, match="...")``: the message pattern; ``pytest.raises(Exc)``: the type.
Only single-line tokens are replaced (columns are UTF-8 byte offsets), so every line number, name and
decorator stays where it was (parametrize arguments are never touched: they name the tests). A real
fix fails every mutated test; code that reads the test to return what it expects passes them.
``Mutant.tests`` lists the tests that were changed (one with no check in its own body is not, and the
mutation run cannot judge it). Expectations computed at run time (``assert f(x) == g(y)`` is only
negated) and checks in helpers are out of reach (docs/threats.md).
"""
from __future__ import annotations

import ast
import random
from dataclasses import dataclass, field

_SWAP_EXC = ("ZeroDivisionError", "UnicodeTranslateError")


@dataclass
class Mutant:
    source: str
    tests: list[str] = field(default_factory=list)  # the test names (as given) that were mutated


def _literal(value, rng: random.Random):
    """A different value of the same kind (None: leave it)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.randint(1, 9)
    if isinstance(value, float):
        return value + rng.choice((0.5, 1.5, 2.5)) * (abs(value) or 1.0)
    if isinstance(value, (str, bytes)):
        alphabet = "qxzjkvw" if isinstance(value, str) else "QXZJ"
        extra = "".join(rng.choice(alphabet) for _ in range(2))
        return value + (extra if isinstance(value, str) else extra.encode())
    return None


Edit = tuple[int, int, int, str]  # (line, start col, end col, new text): one line, UTF-8 byte columns


def _leaf_edit(node: ast.AST, rng: random.Random) -> Edit | None:
    """The edit that changes the first mutable literal leaf of ``node`` (None: there is none)."""
    if isinstance(node, ast.Constant) and node.lineno == node.end_lineno:
        new = _literal(node.value, rng)
        return (node.lineno, node.col_offset, node.end_col_offset, repr(new)) if new is not None else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return _leaf_edit(node.operand, rng)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        elts = node.values if isinstance(node, ast.Dict) else node.elts
        for elt in elts:
            if (edit := _leaf_edit(elt, rng)) is not None:
                return edit
        if not elts and node.lineno == node.end_lineno and not isinstance(node, ast.Set):
            text = {ast.List: "[0]", ast.Tuple: "(0,)", ast.Dict: "{0: 0}"}[type(node)]
            return node.lineno, node.col_offset, node.end_col_offset, text
    return None


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is not None and node.value is not Ellipsis
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_is_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _is_literal(k) and _is_literal(v) for k, v in zip(node.keys, node.values))
    return False


def _call_name(node: ast.AST) -> str:
    f = node.func if isinstance(node, ast.Call) else None
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _assert_edits(node: ast.Assert, rng: random.Random) -> list[Edit]:
    """One change per assert: its literal expected value, else its ``approx`` value, else ``not (...)``."""
    test = node.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq) and _is_literal(left) != _is_literal(right):
            edit = _leaf_edit(right if _is_literal(right) else left, rng)
            if edit is not None:
                return [edit]
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and isinstance(right.value, bool):
            return [(right.lineno, right.col_offset, right.end_col_offset, repr(not right.value))]
    approx = [c for c in ast.walk(test) if _call_name(c) == "approx" and c.args and _is_literal(c.args[0])]
    if approx and (edit := _leaf_edit(approx[0].args[0], rng)) is not None:
        return [edit]
    return [(test.lineno, test.col_offset, test.col_offset, "not ("),
            (test.end_lineno, test.end_col_offset, test.end_col_offset, ")")]


def _edits(func: ast.AST, rng: random.Random) -> list[Edit]:
    out: list[Edit | None] = []
    for node in ast.walk(func):
        if isinstance(node, ast.Assert):
            out += _assert_edits(node, rng)
        elif isinstance(node, ast.Call) and _call_name(node) in ("assertEqual", "assertEquals") \
                and len(node.args) == 2 and _is_literal(node.args[0]) != _is_literal(node.args[1]):
            out.append(_leaf_edit(node.args[1] if _is_literal(node.args[1]) else node.args[0], rng))
        elif isinstance(node, ast.Call) and _call_name(node) == "raises" and node.args:
            match = next((k.value for k in node.keywords if k.arg == "match"), None)
            if isinstance(match, ast.Constant) and isinstance(match.value, str):
                out.append(_leaf_edit(match, rng))
            elif isinstance(exc := node.args[0], ast.Name):
                out.append((exc.lineno, exc.col_offset, exc.end_col_offset, _SWAP_EXC[exc.id == _SWAP_EXC[0]]))
    return [e for e in out if e is not None]


def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    """``name`` and ``Class::name`` of every test function of the module."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}::{sub.name}"] = sub
    return out


def _replace(source: str, edits: list[Edit]) -> str:
    """``source`` with every edit made (right to left, so the columns of the others still hold)."""
    lines = source.encode("utf-8").splitlines(keepends=True)
    for line, start, end, text in sorted(set(edits), key=lambda e: (e[0], e[1], e[2]), reverse=True):
        b = lines[line - 1]
        lines[line - 1] = b[:start] + text.encode("utf-8") + b[end:]
    return b"".join(lines).decode("utf-8")


def mutate(source: str, tests: list[str], rng: random.Random | None = None) -> Mutant:
    """See the module doc. ``tests``: names within the module (``test_x``, ``Class::test_x[p]``)."""
    rng = rng or random.Random()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return Mutant(source)
    funcs = _functions(tree)
    edits, mutated = [], []
    for name in tests:
        func = funcs.get(name.split("[", 1)[0])
        found = _edits(func, rng) if func is not None else []
        if found:
            edits += found
            mutated.append(name)
    return Mutant(_replace(source, edits), mutated)
