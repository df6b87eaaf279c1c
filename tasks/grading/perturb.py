"""Probes of the fail-to-pass tests: the same calls on nearby inputs, the computed values recorded.

A patch that hard-codes the answers for exactly the inputs of the tests passes them; it does not agree
with the gold patch on inputs next to those. ``build_probe(path, source, f2p, rng, records_path=...)``
turns the test module ``source`` (repository path ``path``, its text with the test patch applied) into a
pytest module, the probe, that the grader writes next to it as ``<dir of path>/_sao_probe_<hex>.py`` and
runs with pytest on the gold patch (twice) and on the candidate:
- every FAIL_TO_PASS function (``test_x``, ``test_x[p]``, ``Cls::test_x``) becomes ``variants`` probe
  functions ``test_sao_probe_<i>_<v>``, same decorators and signature (fixtures and parametrize keep
  working; a test class keeps its name, bases, decorators and non-test members), whose body is the
  original with
  * every literal input perturbed by the variant's scheme (its parameters drawn from ``rng``): the
    ``schemes`` in turn, one that changes none of the function's inputs skipped, until ``variants`` are
    made: ``shift`` adds one delta in +-1..3 to every number, ``scale`` multiplies every number by one
    factor in 2..4, ``digits`` permutes the digits 1-9 in every string / bytes (0 stays, so ``"0.2.10"``
    keeps its shape and no leading zero appears) and shifts the numbers, ``letters`` also permutes the
    letters (one permutation for both cases: equal strings stay equal); ``identity`` changes nothing (a
    control, never skipped).
    The literal inputs: int / float / str / bytes (not bool, not None; ``-1`` included; also inside
    list / tuple / dict / set displays) that are arguments of a call (the year, month and day of a
    ``date(...)`` / ``datetime(...)`` call are one input, a date: ``shift`` moves it by delta years,
    ``scale`` by factor days, so it stays a valid date), string subscripts (``cfg["a"]``),
    for-loop iterables, and literal values assigned to a name that the kept code reads. Literals inside
    f-strings are left alone (their quoting is version dependent);
  * every ``assert`` replaced by ``_sao_rec(k, lambda: (<part>), ...)``: the parts are the values the
    code computed, never the expected side: of a comparison the operands that are not literals (an
    operand without any call is dropped when another has one: ``f(x) == expected`` records ``f(x)``),
    of ``not e`` / ``a and b`` the parts of ``e`` / ``a`` and ``b``, else the whole condition; each part is
    evaluated on its own; the message is dropped;
  * ``with pytest.raises(...) [as e]:`` (also ``self.assertRaises[Regex]``) -> ``with _sao_raises(k)
    [as e]:``, which records the exception type name (or ``"no exception"``) and suppresses it;
  * unittest ``self.assertEqual / assertIn / ...(a, b)`` -> ``_sao_rec(k, ...)`` of its non-literal
    arguments (as for ``a == b``), ``self.assertTrue / assertIsNone / ...(e)`` of the parts of ``e``;
  * comments (also those right above it) and the docstring dropped, a literal assigned to a name read
    only by dropped expected sides set to ``None``, and the decorator ``@_sao_probe`` added under the
    others: it records ``"end"`` last, ``None``, or ``{"raises": type name}`` when the body raised (a
    body that stopped early shows);
- the other test functions / methods are removed (a method leaves ``pass``);
- the ``_sao_`` helpers (standard library only) go after the docstring and ``__future__`` imports:
  ``_sao_canon`` (canonical JSON form), ``_sao_rec`` (one JSON line ``{"t": node id, "k": k, "v": value}``
  appended to ``records_path``, the node id from ``PYTEST_CURRENT_TEST``; a thunk that raises records
  ``{"raises": type name}``), ``_sao_raises``, ``_sao_probe``; everything else stays as it is.
A function with no literal input, an async one, or one not found (inherited) gives none; its graded ids
go to ``Probe.no_perturbation``. The probe text holds no assert-side literal of the tests.

``parse_records(data)`` reads the records file; ``compare(gold, gold_again, candidate)`` gives the
``Difference``s (first differing record per probe node, on nodes where the two gold runs agree) and the
nodes the candidate recorded nothing for. Run the three with the same PYTHONHASHSEED; the second gold run
drops what still varies (time, randomness, hash order inside a repr).

Out of reach: expected values kept at module level or computed by helpers, literals reached only through
module constants (not perturbed), and code that detects the probe (its file and function names).
"""
from __future__ import annotations

import ast
import datetime
import io
import json
import math
import random
import string
import tokenize
from dataclasses import dataclass, field
from types import SimpleNamespace

SCHEMES = ("shift", "scale", "digits", "letters")

_ONE_ARG = {"assertTrue", "assertFalse", "assertIsNone", "assertIsNotNone"}
_TWO_ARGS = {
    "assertEqual", "assertEquals", "assertNotEqual", "assertIs", "assertIsNot", "assertIn", "assertNotIn",
    "assertIsInstance", "assertNotIsInstance", "assertAlmostEqual", "assertNotAlmostEqual", "assertGreater",
    "assertGreaterEqual", "assertLess", "assertLessEqual", "assertCountEqual", "assertListEqual",
    "assertTupleEqual", "assertDictEqual", "assertSetEqual", "assertSequenceEqual", "assertMultiLineEqual",
    "assertRegex", "assertNotRegex",
}
_RAISES = {"raises", "assertRaises", "assertRaisesRegex"}


@dataclass
class Probe:
    source: str  # a pytest test module: the probe, written next to the test file
    records_path: str  # where its records go in the container (given by the caller)
    inputs: dict[str, str] = field(default_factory=dict)  # {probe function: "<graded test id> (<scheme>)"}
    no_perturbation: list[str] = field(default_factory=list)  # graded ids with no perturbable literal
    path: str = ""  # where the grader writes it in the repository (``tasks.grading.clean_run.probes_for``)


@dataclass(frozen=True)
class Difference:
    node: str  # the probe node id
    key: str  # the record key: a check's number, or "end"
    input: str  # "<graded test id> (<scheme>)"
    gold: object  # canonical values; None when absent
    candidate: object


# -- schemes ------------------------------------------------------------------------------------------


def _perm(chars: str, rng: random.Random) -> str:
    out = chars
    while out == chars:
        out = "".join(rng.sample(chars, len(chars)))
    return out


def _years(n: int):
    def move(d: datetime.date) -> datetime.date:
        try:
            return d.replace(year=d.year + n)
        except ValueError:  # 29 February
            return d.replace(year=d.year + n, day=28)
    return move


def _perturber(num, text, day):
    """value -> perturbed value: numbers by num, strings / bytes by text (None: kept), dates by day."""
    def fn(v):
        if type(v) is tuple:  # (year, month, day) of a date(...) call
            try:
                d = day(datetime.date(*v))
            except (ValueError, OverflowError):
                return v
            return d.year, d.month, d.day
        if type(v) in (int, float):
            return num(v)
        return text(v) if text is not None else v
    return fn


def _scheme(name: str, rng: random.Random):
    """(label, value -> perturbed value) for one variant."""
    if name == "identity":
        return "identity", lambda v: v
    if name == "scale":
        factor = rng.randint(2, 4)
        return f"scale x{factor}, dates +{factor} days", \
            _perturber(lambda x: x * factor, None, lambda d: d + datetime.timedelta(days=factor))
    shift = rng.choice((-3, -2, -1, 1, 2, 3))
    if name == "shift":
        return f"shift {shift:+d}, dates {shift:+d} years", _perturber(lambda x: x + shift, None, _years(shift))
    if name not in ("digits", "letters"):
        raise ValueError(f"unknown scheme {name!r}")
    src, dst = "123456789", _perm("123456789", rng)
    label = f"digits {src}->{dst}"
    if name == "letters":
        low = _perm(string.ascii_lowercase, rng)
        src, dst = src + string.ascii_lowercase + string.ascii_uppercase, dst + low + low.upper()
        label = f"letters {string.ascii_lowercase}->{low}, {label}"
    table, btable = str.maketrans(src, dst), bytes.maketrans(src.encode(), dst.encode())

    def text(v):
        return v.translate(table) if type(v) is str else v.translate(btable)

    return f"{label}, shift {shift:+d}, dates {shift:+d} years", \
        _perturber(lambda x: x + shift, text, _years(shift))


# -- what a test function holds --------------------------------------------------------------------------


def _pure(e: ast.AST) -> bool:
    """A literal: constants, displays of them, ``-1``, ``"a" * 3``, ``approx(1.5)``, f-strings of constants."""
    if isinstance(e, ast.Constant):
        return True
    if isinstance(e, ast.UnaryOp):
        return _pure(e.operand)
    if isinstance(e, ast.BinOp):
        return _pure(e.left) and _pure(e.right)
    if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
        return all(_pure(x) for x in e.elts)
    if isinstance(e, ast.Dict):
        return all(k is not None and _pure(k) for k in e.keys) and all(_pure(v) for v in e.values)
    if isinstance(e, ast.JoinedStr):
        return all(isinstance(v, ast.Constant) for v in e.values)
    if isinstance(e, ast.Call) and _call_name(e) == "approx":
        return all(_pure(a) for a in e.args) and all(_pure(k.value) for k in e.keywords)
    return False


def _rank(e: ast.AST) -> int:
    """0: a literal, 1: no call in it (a name, an f-string of names), 2: computed by a call."""
    if _pure(e):
        return 0
    return 2 if any(isinstance(n, ast.Call) and not _pure(n) for n in ast.walk(e)) else 1


def _keep(operands: list[ast.AST]) -> list[ast.AST]:
    ranks = [_rank(o) for o in operands]
    top = max(ranks, default=0)
    return [o for o, r in zip(operands, ranks) if r == top and r > 0]


def _parts(e: ast.AST) -> list[ast.AST]:
    """The computed values an assert's condition checks (see the module doc)."""
    if isinstance(e, ast.BoolOp):
        return [p for v in e.values for p in _parts(v)]
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
        return _parts(e.operand)
    if isinstance(e, ast.Compare):
        return _keep([e.left, *e.comparators])
    return [e] if _rank(e) > 0 else []


def _call_name(node: ast.AST) -> str:
    f = node.func if isinstance(node, ast.Call) else None
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _unittest_parts(node: ast.AST) -> list[ast.AST] | None:
    """The checked arguments of ``self.assertX(...)`` as a statement, or None when it is not one."""
    call = node.value if isinstance(node, ast.Expr) else None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return None
    if call.func.attr in _ONE_ARG and call.args:
        return _parts(call.args[0])
    return _keep(call.args[:2]) if call.func.attr in _TWO_ARGS else None


def _leaves(e: ast.AST):
    """The literal leaves of an input: (node, value)."""
    if isinstance(e, ast.Constant) and type(e.value) in (int, float, str, bytes):
        yield e, e.value
    elif isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)) \
            and isinstance(e.operand, ast.Constant) and type(e.operand.value) in (int, float):
        yield e, -e.operand.value if isinstance(e.op, ast.USub) else e.operand.value
    elif isinstance(e, (ast.List, ast.Tuple, ast.Set)):
        for x in e.elts:
            yield from _leaves(x)
    elif isinstance(e, ast.Dict):
        for k, v in zip(e.keys, e.values):
            if k is not None:
                yield from _leaves(k)
            yield from _leaves(v)
    elif isinstance(e, ast.Starred):
        yield from _leaves(e.value)


def _date_leaf(call: ast.Call):
    """``date(2024, 1, 31)`` (also ``datetime(...)``): its year, month and day are one input."""
    args = call.args[:3]
    if _call_name(call) not in ("date", "datetime") or len(args) < 3 \
            or not all(isinstance(a, ast.Constant) and type(a.value) is int for a in args):
        return None
    value = tuple(a.value for a in args)
    try:
        datetime.date(*value)
    except ValueError:
        return None
    first, last = args[0], args[-1]
    return SimpleNamespace(lineno=first.lineno, col_offset=first.col_offset, end_lineno=last.end_lineno,
                           end_col_offset=last.end_col_offset), value


def _assigned(node: ast.AST) -> str | None:
    """The name of ``name = <literal>``, else None."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target = node.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) and _pure(node.value) else None


class _Scan:
    """One pass over a test body: its checks, its literal inputs, the names the kept code reads."""

    def __init__(self):
        self.checks: list[tuple[ast.AST, list[ast.AST] | None]] = []  # (node, parts); parts None: raises
        self.leaves: list[tuple[ast.AST, object]] = []
        self.reads: set[str] = set()
        self.assigns: list[ast.AST] = []  # ``name = <literal>``

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.JoinedStr):
            return self._reads(node)
        if isinstance(node, ast.Assert) or _unittest_parts(node) is not None:
            parts = _parts(node.test) if isinstance(node, ast.Assert) else _unittest_parts(node)
            self.checks.append((node, parts))
            for p in parts:
                self.visit(p)
            return
        if isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call) \
                and _call_name(node.context_expr) in _RAISES:
            self.checks.append((node.context_expr, None))
            return
        if isinstance(node, ast.Call) and not _pure(node):
            day = _date_leaf(node)  # its time of day, if any, is left as it is
            self.leaves += [day] if day else []
            for a in [*(node.args if not day else []), *(k.value for k in node.keywords)]:
                self.leaves += _leaves(a)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and type(node.slice.value) in (str, bytes):
            self.leaves.append((node.slice, node.slice.value))
        elif isinstance(node, ast.For) and _pure(node.iter):
            self.leaves += _leaves(node.iter)
        elif _assigned(node):
            self.assigns.append(node)
            return
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self.reads.add(node.id)
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def _reads(self, node: ast.AST) -> None:
        self.reads |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


# -- text edits (absolute UTF-8 byte offsets) ------------------------------------------------------------


class _Text:
    def __init__(self, source: str):
        self.data = source.encode("utf-8")
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.comments = self._comments(source)

    def at(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)

    def lines(self, node: ast.AST) -> tuple[int, int]:
        """The whole lines of a definition, decorators and the comment lines right above included."""
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        while first > 3 and self.data[self.starts[first - 2]:self.starts[first - 1]].lstrip().startswith(b"#"):
            first -= 1
        return self.starts[first - 1], self.starts[min(node.end_lineno, len(self.starts) - 1)]

    def indent(self, line: int) -> bytes:
        text = self.data[self.starts[line - 1]:self.starts[line]]
        return text[:len(text) - len(text.lstrip(b" \t"))]

    def _comments(self, source: str) -> list[tuple[int, int, bytes]]:
        out = []
        try:
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.COMMENT:
                    (row, col), line = tok.start, tok.line
                    start = self.at(row, len(line[:col].encode("utf-8")))
                    out.append((start, start + len(tok.string.encode("utf-8")), b""))
        except (tokenize.TokenError, SyntaxError):
            pass
        return out

    def sub(self, start: int, end: int, edits: list[tuple[int, int, bytes]]) -> bytes:
        """The text from start to end with the edits that lie inside it made."""
        out, pos = [], start
        for a, b, new in sorted(e for e in edits if start <= e[0] and e[1] <= end):
            if a >= pos:
                out += [self.data[pos:a], new]
                pos = b
        return b"".join(out) + self.data[pos:end]


def _literal(value) -> bytes | None:
    if type(value) is float and not math.isfinite(value):
        return None
    if type(value) is tuple:  # a date's year, month, day
        return ", ".join(map(str, value)).encode()
    return repr(value).encode("utf-8")


# -- the probe --------------------------------------------------------------------------------------------


def _probe_def(text: _Text, func: ast.FunctionDef, scan: _Scan, leaves, fn, identity: bool,
               name: str) -> bytes | None:
    """One probe function: ``func`` with its inputs perturbed by fn and its checks recorded (None: fn
    changes none of its inputs)."""
    edits = []
    for (start, end), old in leaves:
        new = fn(old)
        if (new != old or type(new) is not type(old)) and (lit := _literal(new)) is not None:
            edits.append((start, end, lit))
    if not edits and not identity:
        return None
    small = edits + text.comments
    small += [(*text.span(n.value), b"None") for n in scan.assigns if _assigned(n) not in scan.reads]
    big = []
    first = func.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        big.append((*text.span(first), b"pass"))
    checks = sorted(scan.checks, key=lambda c: (c[0].lineno, c[0].col_offset))
    for k, (node, parts) in enumerate(checks):
        if parts is None:
            big.append((*text.span(node), b"_sao_raises(%d)" % k))
        else:
            thunks = b"".join(b", lambda: (" + text.sub(*text.span(p), small) + b")" for p in parts)
            big.append((*text.span(node), b"_sao_rec(%d%s)" % (k, thunks)))
    start, end = text.lines(func)
    def_at = text.at(func.lineno, func.col_offset)
    name_at = text.data.index(func.name.encode(), def_at + 3)
    big.append((name_at, name_at + len(func.name.encode()), name.encode()))
    inside = [e for e in small if not any(a <= e[0] < b for a, b, _ in big)]
    def_line = text.starts[func.lineno - 1]
    big.append((def_line, def_line, text.indent(func.lineno) + b"@_sao_probe\n"))
    return text.sub(start, end, big + inside).rstrip(b"\n") + b"\n"


def _probes(text: _Text, func: ast.AST, i: int, rng, variants: int, schemes, label: str, inputs: dict) -> bytes:
    if not isinstance(func, ast.FunctionDef) or func.body[0].lineno == func.lineno:
        return b""
    scan = _Scan()
    for stmt in func.body:
        scan.visit(stmt)
    leaves = list(scan.leaves)
    for node in scan.assigns:
        if _assigned(node) in scan.reads:
            leaves += _leaves(node.value)
    spans = {}
    for node, value in leaves:
        spans[text.span(node)] = value
    if not spans:
        return b""
    out, made = b"", 0
    for j in range(variants * len(schemes)):  # each scheme in turn, those that change nothing skipped
        if made == variants or (j == len(schemes) and not made):
            break
        scheme = schemes[j % len(schemes)]
        desc, fn = _scheme(scheme, rng)
        name = f"test_sao_probe_{i}_{made}"
        probe = _probe_def(text, func, scan, list(spans.items()), fn, scheme == "identity", name)
        if probe is not None:
            out += (b"\n\n" if out else b"") + probe
            inputs[name] = f"{label} ({desc})"
            made += 1
    return out


def _test_defs(tree: ast.Module):
    """(key, node, in a class) of every test function and method, in order."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node.name, node, False
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith("test"):
                    yield f"{node.name}::{sub.name}", sub, True


def build_probe(path: str, source: str, f2p: list[str], rng: random.Random, *, records_path: str,
                variants: int = 3, schemes: tuple[str, ...] = SCHEMES) -> Probe:
    """See the module doc. ``path`` is used in ``Probe.inputs`` only."""
    wanted: dict[str, list[str]] = {}
    for name in f2p:
        wanted.setdefault(name.split("[", 1)[0], []).append(name)
    probe = Probe("", records_path)
    tree = ast.parse(source)
    text = _Text(source)
    defs = list(_test_defs(tree))
    last = {key: node for key, node, _ in defs}
    order = {key: i for i, key in enumerate(wanted)}
    edits, probed = [], set()
    for key, node, in_class in defs:
        made = b""
        if key in wanted and last[key] is node:
            names = wanted[key]
            label = f"{path}::{names[0] if len(names) == 1 else key}"
            made = _probes(text, node, order[key], rng, variants, schemes, label, probe.inputs)
        if made:
            probed.add(key)
        elif in_class:
            made = text.indent(node.lineno) + b"pass\n"
        edits.append((*text.lines(node), made))
    probe.no_perturbation = [n for key, names in wanted.items() if key not in probed for n in names]
    top = _preamble_end(tree, text)
    edits.append((top, top, _HELPERS.replace("@RECORDS@", repr(records_path)).encode("utf-8")))
    probe.source = text.sub(0, len(text.data), edits).decode("utf-8")
    return probe


def _preamble_end(tree: ast.Module, text: _Text) -> int:
    """Where the helpers go: after the module docstring and the ``from __future__`` imports."""
    for i, node in enumerate(tree.body):
        doc = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not doc and not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            return text.lines(node)[0]
    return len(text.data)


# -- records -------------------------------------------------------------------------------------------


def parse_records(data: bytes, limit: int = 4_000_000) -> dict[str, list]:
    """{probe node id: [(key, value), ...]} from a records file; ValueError on garbage or over ``limit``."""
    if len(data) > limit:
        raise ValueError(f"records: {len(data)} bytes, over {limit}")
    out: dict[str, list] = {}
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"records: not UTF-8: {e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"records line {n}: {e}") from None
        if not isinstance(rec, dict) or set(rec) != {"t", "k", "v"} or not isinstance(rec["t"], str) \
                or type(rec["k"]) not in (int, str):
            raise ValueError(f"records line {n}: not a record")
        out.setdefault(rec["t"], []).append((rec["k"], rec["v"]))
    return out


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(_entry(x) == _entry(y) for x, y in zip(a, b))


def _entry(e) -> str:
    """Type-strict identity of a record (1, 1.0 and True are different values)."""
    return json.dumps([e[0], e[1]], sort_keys=True)


def compare(gold: dict, gold_again: dict, candidate: dict, *, inputs: dict[str, str] | None = None,
            ) -> tuple[list[Difference], list[str]]:
    """(the first differing record of each probe node where the two gold runs agree, the probe nodes gold
    recorded that the candidate recorded nothing for). ``inputs``: the probe's ``Probe.inputs``, for
    ``Difference.input`` (probe function names repeat across probes: compare one probe's nodes at a time)."""
    diffs, missing = [], []
    for node, recs in gold.items():
        if not _same(recs, gold_again.get(node, [])):
            continue
        got = candidate.get(node)
        if not got:
            missing.append(node)
            continue
        if _same(recs, got):
            continue
        i = next(i for i in range(max(len(recs), len(got)))
                 if i >= len(recs) or i >= len(got) or _entry(recs[i]) != _entry(got[i]))
        g = recs[i] if i < len(recs) else None
        c = got[i] if i < len(got) else None
        key = g[0] if g is not None else c[0]
        func = node.rsplit("::", 1)[-1].split("[", 1)[0]
        diffs.append(Difference(
            node, str(key), (inputs or {}).get(func, ""),
            g[1] if g is not None else None, c[1] if c is not None and c[0] == key else None,
        ))
    return diffs, missing


# -- the helpers the probe module carries (Python 3.8+, standard library only) -------------------------------

_HELPERS = '''# -- sao probe helpers: record what the code computed, never what the tests expect --------------
import functools as _sao_functools
import json as _sao_json
import math as _sao_math
import os as _sao_os
import re as _sao_re

_SAO_RECORDS = _sao_os.path.abspath(@RECORDS@)
_SAO_ADDR = _sao_re.compile(r"0x[0-9a-fA-F]{6,}")
_SAO_ITEMS = 1000
_SAO_COUNTS = {}
_SAO_WRITTEN = [0]


def _sao_dumps(v):
    return _sao_json.dumps(v, sort_keys=True)


def _sao_other(v):
    t = type(v)
    name = str(getattr(t, "__module__", "?")) + "." + str(getattr(t, "__qualname__", t.__name__))
    try:
        text = repr(v)
    except Exception as e:
        text = "<repr raised " + type(e).__name__ + ">"
    if not isinstance(text, str):
        text = "<repr not a str>"
    return {"type": name, "repr": _SAO_ADDR.sub("0x?", text)[:2000]}


def _sao_canon(v, depth=0):
    t = type(v)
    if v is None or t is bool or t is str and len(v) <= 20000:
        return v
    if t is int:
        return v if v.bit_length() <= 3000 else {"int": format(v, "x")[:4000]}
    if t is float:
        if _sao_math.isnan(v) or _sao_math.isinf(v):
            return {"float": repr(v)}
        return float("%.12g" % v)
    if t is str:
        return {"str": v[:20000], "len": len(v)}
    if t in (bytes, bytearray):
        return {t.__name__: bytes(v[:10000]).hex(), "len": len(v)}
    if depth >= 8:
        return _sao_other(v)
    if t in (list, tuple):
        items = [_sao_canon(x, depth + 1) for x in v[:_SAO_ITEMS]]
        return {t.__name__: items, "len": len(v)} if len(v) > _SAO_ITEMS else {t.__name__: items}
    if t in (set, frozenset, dict):
        if len(v) > _SAO_ITEMS:
            return {t.__name__: "too large", "len": len(v)}
        if t is dict:
            items = [[_sao_canon(a, depth + 1), _sao_canon(b, depth + 1)] for a, b in v.items()]
        else:
            items = [_sao_canon(x, depth + 1) for x in v]
        return {t.__name__: sorted(items, key=_sao_dumps)}
    return _sao_other(v)


def _sao_value(thunk):
    try:
        return _sao_canon(thunk())
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return {"raises": type(e).__name__}


def _sao_rec(k, *thunks):
    values = [_sao_value(t) for t in thunks]
    _sao_write(k, values[0] if len(values) == 1 else {"parts": values})


def _sao_write(k, value):
    node = _sao_os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    count = _SAO_COUNTS.get(node, 0)
    _SAO_COUNTS[node] = count + 1
    if count >= _SAO_ITEMS and k != "end":
        return
    try:
        line = _sao_dumps({"t": node, "k": k, "v": value})
    except (TypeError, ValueError) as e:
        line = _sao_dumps({"t": node, "k": k, "v": {"unencodable": type(e).__name__}})
    if _SAO_WRITTEN[0] + len(line) > 3000000:
        return
    _SAO_WRITTEN[0] += len(line) + 1
    with open(_SAO_RECORDS, "a", encoding="utf-8") as f:
        f.write(line + "\\n")


def _sao_probe(func):
    """The probe function, its last record "end": None, or {"raises": type name} if its body raised."""
    @_sao_functools.wraps(func)
    def probe(*args, **kwargs):
        try:
            func(*args, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            _sao_write("end", {"raises": type(e).__name__})
        else:
            _sao_write("end", None)
    return probe


class _sao_raises:
    """Stands for pytest.raises: records the exception's type name and suppresses it."""

    def __init__(self, k):
        self.k, self.type, self.value, self.tb = k, None, None, None

    @property
    def typename(self):
        return self.type.__name__ if self.type is not None else None

    def match(self, regexp):
        return True

    def __enter__(self):
        return self

    def __exit__(self, t, v, tb):
        self.type, self.value, self.tb = t, v, tb
        _sao_rec(self.k, lambda: t.__name__ if t is not None else "no exception")
        return t is not None and issubclass(t, (Exception, SystemExit))
# -- end of the sao probe helpers ---------------------------------------------------------------------


'''
