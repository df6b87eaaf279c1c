"""Variants of a graded test module: each FAIL_TO_PASS test hidden among look-alike copies that must fail.

``build_variant(source, f2p, rng, *, max_columns=8) -> ModuleVariant``. ``f2p``: the graded test names
within the module (``test_x``, ``test_x[p]``, ``Cls::test_x``, ``Cls::test_x[p]``); the functions copied
are the distinct names with the parameters stripped.

Columns. The mutable checks of a test function are the ones that always run when the test passes: the
direct statements of its body, and those of the ``with`` blocks in it that do not catch or swallow
exceptions (never inside if / for / while / try, a ``raises`` block or a nested function; nothing after a
direct ``return`` / ``raise``). A check is one of: ``assert <expr> == <literal>`` (either side; the literal,
or one random leaf of a list / tuple / set / dict literal), ``assert <expr> == approx(<literal>)``,
``self.assertEqual(a, <literal>)``, ``pytest.raises(Exc, match="...")`` (the pattern) and
``pytest.raises(Exc)`` for a builtin ``Exc`` (swapped for one that is neither its subclass nor its
superclass). Bare conditions (``assert x``, ``!=``, ``in``, ``is None``) are never changed. With more than
``max_columns`` checks, that many are chosen at random. Each column draws one mutant value (level 1; level 0
is the original) of the original's shape: same type; an int keeps its sign and digit count, a float its
token shape (exponent kept, the digits redrawn; inside ``approx`` the leading significant digit moves by 2
or more, so the value is outside any sane tolerance), a str / bytes its length, character classes and
every other character (escapes untouched), a bool is flipped. A string is drawn from the module's own
vocabulary (its other string literals; its words: identifiers split on ``_`` and case, the words of its
strings and comments, digit runs) so that it reads as naturally as the original, and evenly: what occurs
elsewhere in the module becomes something else that does, what occurs nowhere else something that occurs
nowhere. A literal some other token holds too becomes another of the module's literals of its shape; else
a random non-empty subset of its letter / digit runs changes, each to a module word of the same length and
case; a run found nowhere else, or one with no such word, is redrawn (a random subset of its letters /
digits, in their class); a string with no letter or digit gets one punctuation character swapped. Of a
collection literal, a leaf that can change so is preferred. A ``pytest.raises`` type is swapped for one the
module names elsewhere when it names the original elsewhere, else for a common one it does not name. In a
``match`` pattern only characters every match needs change (none in a class, a group or before a
repetition; a pattern with ``|`` is left alone), so the pattern stays a valid regex that no longer matches.
Only single-line tokens change, through UTF-8 byte columns, so every other character stays as it was.

Copies. A function with m columns gets the N = 2**k rows of a two-level orthogonal array of strength 2
(k >= 2 the smallest with 2**(k-1) >= m): rows r in GF(2)^k, m random distinct columns c of odd weight,
level(r, c) = parity(r & c). Every column is at level 0 in exactly half the rows, every pair of columns is
balanced, row 0 is all zeros and row 2**k-1 all ones. A row at level 0 on every column is a ``real`` copy
(the original test: it must pass), the all-ones row the ``decoy``, every other row a ``mutant``; each is
the function's text (decorators included) under a fresh name, and the function's definition is replaced,
in place, by its N copies in a random order. Every name (real ones too) is drawn alike: ``test_`` + words
of the module's test names + a number, unique in the module. A function with no column gets one renamed
real copy; one that is not found (inherited, generated) keeps its name; both are listed in ``unmutated``.

Canaries (``tasks.grading.canary.Canaries``): two plain tests, named alike, at random top-level gaps after the last
import, with bodies that vary (sorted / sum / join / len / ...): ``must_pass`` holds, ``must_fail`` does not.

``ModuleVariant.decoy`` is the original module with every chosen column at level 1: the look-alike
pristine module (original names, no copies, no canaries). Source that does not parse gets the canaries
appended, identity copies and ``decoy = source``.
"""
from __future__ import annotations

import ast
import builtins
import copy
import functools
import io
import keyword
import random
import re
import string
import tokenize
from collections import Counter
from dataclasses import dataclass

from sao_harness.tasks.grading.canary import Canaries


@dataclass(frozen=True)
class Copy:
    name: str  # the copy's function name in the variant module
    role: str  # "real" | "mutant" | "decoy"


@dataclass
class ModuleVariant:
    source: str  # the module as the graded run gets it
    copies: dict[str, list[Copy]]  # {"test_x" / "Cls::test_x": its copies, in no meaningful order}
    canaries: Canaries
    decoy: str  # the original module with every chosen column at level 1
    unmutated: list[str]  # F2P functions (keys of copies) with no mutable check


Edit = tuple[int, int, int, str]  # (line, start col, end col, new text): one line, UTF-8 byte columns

# builtin exceptions a `pytest.raises(Exc)` column swaps among (never for a subclass or a superclass)
_EXCEPTIONS = ("ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "ZeroDivisionError",
               "RuntimeError", "NotImplementedError", "OverflowError", "UnicodeError", "LookupError",
               "ArithmeticError", "OSError", "FileNotFoundError", "PermissionError", "RecursionError",
               "NameError", "ImportError", "ModuleNotFoundError", "EOFError", "StopIteration")
# the ones a swap prefers when the original is named nowhere else in the module
_COMMON_EXCEPTIONS = ("ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "RuntimeError",
                      "LookupError", "OSError", "NotImplementedError")
_CATCHING = ("raises", "assertRaises", "assertRaisesRegex", "suppress")  # with-blocks whose body may not run
_PUNCT = "".join(c for c in string.punctuation if c not in "'\"\\")
_REGEX_META = set(".^$*+?{}[]|()\\")
_DEFAULT_WORDS = ["value", "result", "case"]
_STRING = re.compile(r"([rRbBuU]{0,2})('''|\"\"\"|'|\")(.*)\2", re.S)
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # a word: UPPER, Title, lower or digits
_ALNUM = set(string.ascii_letters + string.digits)
_RUN = re.compile(r"[A-Za-z0-9]+")


# --- the AST helpers (as in tasks.mutate) -------------------------------------------------------------

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


def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    """``name`` and ``Class::name`` of every function of the module."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}::{sub.name}"] = sub
    return out


def _apply(lines: list[bytes], edits: list[Edit], first: int = 1) -> list[bytes]:
    """``lines`` (line ``first`` onwards) with every edit made, right to left so the other columns hold."""
    lines = list(lines)
    for line, start, end, text in sorted(set(edits), reverse=True):
        b = lines[line - first]
        lines[line - first] = b[:start] + text.encode("utf-8") + b[end:]
    return lines


# --- shape-preserving mutant literals -----------------------------------------------------------------

def _new_number(token: str, value: int | float, rng: random.Random, far: bool) -> str | None:
    """``token`` with its mantissa digits redrawn (exponent, point, underscores kept); ``far``: the leading
    significant digit moves by 2 or more."""
    shape = re.fullmatch(r"([0-9_.]+)([eE][+-]?[0-9_]+)?", token)
    if shape is None:
        return None
    mantissa, exponent = shape.groups(default="")
    at = [i for i, ch in enumerate(mantissa) if ch.isdigit()]
    digits = [int(mantissa[i]) for i in at]
    if isinstance(value, int) and len(digits) > 1 and digits[0] == 0:
        return None  # 0x.., 0o.., 00: not a decimal int
    lead = next((j for j, d in enumerate(digits) if d), None)
    for _ in range(100):
        new = list(digits)
        if lead is None:  # all zeros: the last digit becomes non-zero
            new[-1] = rng.randint(2 if far else 1, 9)
        elif isinstance(value, int) and len(digits) == 1:
            new[0] = rng.choice([d for d in range(10) if abs(d - digits[0]) >= (2 if far else 1)])
        else:  # zeros before the leading digit stay, the leading digit stays non-zero
            new[lead] = rng.choice([d for d in range(1, 10) if abs(d - digits[lead]) >= (2 if far else 0)])
            new[lead + 1:] = [rng.randint(0, 9) for _ in digits[lead + 1:]]
        chars = list(mantissa)
        for i, d in zip(at, new):
            chars[i] = str(d)
        text = "".join(chars) + exponent
        if ast.literal_eval(text) != value:
            return text
    return None


def _protected(body: str, raw: bool, regex: bool) -> set[int]:
    """Positions in a string token's ``body`` that must stay: escapes, and with ``regex`` its syntax."""
    keep, i = set(), 0
    while i < len(body):
        if body[i] == "\\":
            n = 2
            if not raw:
                c = body[i + 1:i + 2]
                if c in ("x", "u", "U"):
                    n = {"x": 4, "u": 6, "U": 10}[c]
                elif c == "N":
                    n = body.find("}", i) + 1 - i
                elif c in "01234567":
                    n = 1 + len(re.match(r"[0-7]{1,3}", body[i + 1:]).group())
                elif c == "\\" and regex:
                    n = 3  # a regex escape written as "\\d": its letter stays
            keep.update(range(i, i + max(n, 2)))
            i += max(n, 2)
            continue
        i += 1
    if regex:  # only the characters every match needs may change: not in a class, a group or a repetition
        masked = "".join("\0" if i in keep else ch for i, ch in enumerate(body))
        for m in re.finditer(r"\[[^\]]*\]|\{[^}]*\}|.(?=[?*{])", masked):
            keep.update(range(m.start(), m.end()))
        depth = 0
        for i, ch in enumerate(masked):
            depth += (ch == "(") - (ch == ")")
            if depth or ch == ")":
                keep.add(i)
    return keep


def _redraw(ch: str, rng: random.Random) -> str:
    pool = next(p for p in (string.ascii_lowercase, string.ascii_uppercase, string.digits, _PUNCT) if ch in p)
    return rng.choice([c for c in pool if c != ch])


def _terms(text: str) -> set[str]:
    """The words of ``text``, lower-cased: its ASCII letter / digit runs and their ``_WORD`` parts."""
    return {t.lower() for run in _RUN.findall(text) for t in (run, *_WORD.findall(run))}


def _literal_terms(body: str, value: str | bytes) -> tuple[set[str], set[str]]:
    """The words of a string token, as read in its value and in its source text: (either, both)."""
    a, b = _terms(value if isinstance(value, str) else value.decode("latin-1")), _terms(body)
    return a | b, a & b


@dataclass(frozen=True)
class _Vocabulary:
    """A module's own words and string literals, counted by the tokens they occur in: names (keywords
    aside), numbers, strings, comments. A word is an ASCII letter / digit run or one of its ``_WORD``
    parts (identifiers split on ``_`` and case), lower-cased; a string's words are read both in its value
    and in its source text (escapes), ``seen`` in either, ``counts`` in both."""
    seen: Counter  # word: the number of tokens holding it, read either way
    counts: Counter  # word: the number of tokens holding it, read both ways
    shared: dict[tuple[bool, ...], list[str]]  # digit mask: the words of ``counts`` >= 2 of that shape, sorted
    literals: Counter  # the value of a string token: the number of tokens holding it
    bodies: dict[int, list[str]]  # length: the bodies (between the quotes) of the string tokens whose words
    # are all words of two tokens or more (none private to another one), sorted
    names: Counter  # name token: how often


@functools.lru_cache(maxsize=32)
def _vocabulary(source: str) -> _Vocabulary:
    seen, counts, literals, names, bodies = Counter(), Counter(), Counter(), Counter(), {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        tokens = []
    for tok in tokens:
        text = tok.string
        if tok.type == tokenize.NAME:
            names[text] += 1
            if keyword.iskeyword(text) or keyword.issoftkeyword(text):
                continue
        elif tok.type == tokenize.STRING:
            m = _STRING.fullmatch(text)
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = None
            if m is not None and isinstance(value, (str, bytes)):
                literals[value] += 1
                either, both = _literal_terms(m.group(3), value)
                bodies[m.group(3)] = either
                seen.update(either)
                counts.update(both)
                continue
        elif tok.type not in (tokenize.NUMBER, tokenize.COMMENT, getattr(tokenize, "FSTRING_MIDDLE", -1)):
            continue
        seen.update(_terms(text))
        counts.update(_terms(text))
    shared: dict[tuple[bool, ...], list[str]] = {}
    for w in sorted(w for w, n in counts.items() if n >= 2):
        shared.setdefault(_mask(w), []).append(w)
    by_length: dict[int, list[str]] = {}
    for body in sorted(b for b, words in bodies.items() if all(counts[w] >= 2 for w in words)):
        by_length.setdefault(len(body), []).append(body)
    return _Vocabulary(seen, counts, shared, literals, by_length, names)


def _mask(word: str) -> tuple[bool, ...]:
    return tuple(c in string.digits for c in word)


def _shape(text: str) -> str:
    """``text`` with each ASCII letter / digit replaced by its class; every other character kept."""
    return "".join("l" if c in string.ascii_lowercase else "u" if c in string.ascii_uppercase
                   else "d" if c in string.digits else c for c in text)


def _simple(word: str) -> bool:
    """Whether ``word``'s letters are all lower-case, all upper-case, or a capital and lower-case ones."""
    return word in (word.lower(), word.upper()) or word[0].isupper() and word[1:] == word[1:].lower()


def _recase(word: str, like: str) -> str:
    """The lower-case ``word`` cased as the ``_simple`` ``like``."""
    return word.upper() if like != like.lower() and like == like.upper() else \
        word.capitalize() if like[0].isupper() else word


def _units(body: str, keep: set[int], vocab: _Vocabulary, either: set[str], both: set[str]) -> tuple[list, list]:
    """The units of ``body`` that ``_natural_string`` may change: (natural, unique), each a list of
    (start, end, the words it may become (None: redrawn), the run it is part of (None: the unit is the run)).
    natural: units found elsewhere in the module that have another module word of their shape; unique:
    units found nowhere else. ``either`` / ``both``: the literal's words read in its value or its source
    text / in both (``_literal_terms``)."""
    def elsewhere(word: str) -> bool:
        return vocab.seen[word.lower()] > (word.lower() in either)

    def options(word: str) -> list[str]:
        return [_recase(w, word) for w in vocab.shared.get(_mask(word), ())
                if w != word.lower() and vocab.counts[w] > (w in both)]

    masked = "".join(ch if i not in keep and ch in _ALNUM else " " for i, ch in enumerate(body))
    natural, unique = [], []
    for m in _RUN.finditer(masked):
        run, at = m.group(), m.start()
        parts = [(at + w.start(), at + w.end(), w.group()) for w in _WORD.finditer(run)]
        if elsewhere(run):
            if _simple(run) and (opts := options(run)):
                natural.append((at, m.end(), opts, None))
        elif len(parts) == 1:
            unique.append((at, m.end(), None, None))
        else:
            for start, end, word in parts:
                if not elsewhere(word):
                    unique.append((start, end, None, (at, m.end())))
                elif opts := options(word):
                    natural.append((start, end, opts, (at, m.end())))
    return natural, unique


def _natural_string(prefix: str, quote: str, body: str, value: str | bytes, keep: set[int], rng: random.Random,
                    regex: bool, vocab: _Vocabulary) -> str | None:
    """A token of ``value``'s shape drawn from the module's own vocabulary (None: it has none).

    Even to a reader who checks what else the module holds: what occurs elsewhere in the module is replaced
    by something that does, what occurs nowhere else by something that occurs nowhere.
    1. A literal some other string token holds too becomes another of the module's literals of the same
       shape (length, character classes, every other character; escapes and regex syntax kept).
    2. Else a random non-empty subset of its units changes. A unit is a run of free ASCII letters / digits,
       or, in a run found nowhere else, one of its ``_WORD`` parts. If some units are found elsewhere and
       have another module word of their length and digit places (in two tokens or more, one of them not
       this one), only those change, each to such a word in the same case; else the units found nowhere
       else are redrawn in their classes into no word of the module. A run found elsewhere with no such
       word (or not cased simply) is left to the caller's redraw."""
    def made(chars) -> tuple[str, str | bytes] | None:
        text = prefix + quote + "".join(chars) + quote
        try:
            new = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
        if type(new) is type(value) and len(new) == len(value) and new != value and (not regex or _compiles(new)):
            return text, new
        return None

    if vocab.literals[value] >= 2:  # the literal occurs elsewhere: another of the module's literals
        shape = _shape(body)
        bodies = [b for b in vocab.bodies.get(len(body), ()) if b != body and _shape(b) == shape
                  and all(b[i] == body[i] for i in keep)]
        rng.shuffle(bodies)
        for b in bodies:
            if (out := made(b)) is not None:
                return out[0]
    natural, unique = _units(body, keep, vocab, *_literal_terms(body, value))
    pool = natural or unique
    if not pool:
        return None
    for attempt in range(20):
        chars = list(body)
        chosen = [u for u in pool if rng.random() < 0.5] or [rng.choice(pool)]
        for start, end, opts, _ in chosen:
            word = body[start:end]
            if opts:
                new = rng.choice(opts)
            else:  # redrawn, into no word of the module
                for _ in range(10):
                    at = [i for i in range(len(word)) if rng.random() < 0.5] or [rng.randrange(len(word))]
                    new = "".join(_redraw(c, rng) if i in at else c for i, c in enumerate(word))
                    if new.lower() not in vocab.seen:
                        break
            chars[start:end] = new
        late = attempt >= 15
        if not late and any(run and "".join(chars[run[0]:run[1]]).lower() in vocab.seen for *_, run in chosen):
            continue  # a run found nowhere else stays so
        out = made(chars)
        if out is None:
            continue
        if not late and vocab.literals[value] < 2 and vocab.literals[out[1]]:
            continue  # a literal found nowhere else does not become one found elsewhere
        return out[0]
    return None


def _new_string(token: str, value: str | bytes, rng: random.Random, regex: bool,
                vocab: _Vocabulary | None = None, strict: bool = False) -> str | None:
    """``token`` (one string literal) with another value of its shape: same quotes, prefix and length.
    With the module's ``vocab``, drawn from it where it can be (``_natural_string``; ``strict``: nowhere
    else); else a random non-empty subset of its ASCII letters / digits redrawn in their class (else one
    punctuation character swapped)."""
    m = _STRING.fullmatch(token)
    if m is None or not value:
        return None
    prefix, quote, body = m.groups()
    if regex and "|" in body:
        return None  # a changed alternative may leave another that matches
    keep = _protected(body, "r" in prefix.lower(), regex)
    if vocab is not None and (text := _natural_string(prefix, quote, body, value, keep, rng, regex, vocab)):
        return text
    if strict:
        return None
    free = [i for i, ch in enumerate(body) if i not in keep and ch in string.ascii_letters + string.digits]
    punct = [i for i, ch in enumerate(body) if i not in keep and ch in _PUNCT
             and not (regex and ch in _REGEX_META)]
    for _ in range(20):
        chars = list(body)
        if free:
            chosen = [i for i in free if rng.random() < 0.5] or [rng.choice(free)]
        elif punct:
            chosen = [rng.choice(punct)]
        else:
            return None
        for i in chosen:
            new = _redraw(chars[i], rng)
            while regex and new in _REGEX_META:
                new = _redraw(chars[i], rng)
            chars[i] = new
        text = prefix + quote + "".join(chars) + quote
        new_value = ast.literal_eval(text)
        if type(new_value) is type(value) and len(new_value) == len(value) and new_value != value:
            if not regex or _compiles(new_value):
                return text
    return None


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
        return True
    except re.error:
        return False


def _new_token(token: str, value, rng: random.Random, *, far: bool = False, regex: bool = False,
               vocab: _Vocabulary | None = None, strict: bool = False) -> str | None:
    """A literal token of ``value``'s shape with another value (None: it has no such token); a string's
    drawn from the module's ``vocab`` where it can be (``strict``: else none)."""
    if far and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return None
    if isinstance(value, bool):
        return repr(not value)
    if isinstance(value, (int, float)):
        return _new_number(token, value, rng, far) if re.fullmatch(r"[0-9_.eE+-]+", token) else None
    if isinstance(value, (str, bytes)):
        return _new_string(token, value, rng, regex, vocab, strict)
    return None


# --- columns ------------------------------------------------------------------------------------------

def _token(lines: list[bytes], node: ast.AST) -> str | None:
    if node.lineno != node.end_lineno:
        return None
    return lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode("utf-8")


def _changes(literal: ast.AST, leaf: ast.Constant, new_value) -> bool:
    """Whether ``literal`` with ``leaf`` set to ``new_value`` has another value (a set may absorb it)."""
    twin = copy.deepcopy(literal)
    for a, b in zip(ast.walk(literal), ast.walk(twin)):
        if a is leaf:
            b.value = new_value
    try:
        return ast.literal_eval(twin) != ast.literal_eval(literal)
    except (ValueError, TypeError, SyntaxError):
        return False


def _leaf_edit(literal: ast.AST, lines: list[bytes], rng: random.Random, *, far: bool = False,
               regex: bool = False, vocab: _Vocabulary | None = None) -> Edit | None:
    """The edit giving one random leaf of ``literal`` another value of its shape (None: none can); with
    the module's ``vocab``, a leaf whose new value comes from it (``_natural_string``) where there is one."""
    leaves = [n for n in ast.walk(literal) if isinstance(n, ast.Constant)]
    rng.shuffle(leaves)
    for strict in (True, False) if vocab is not None and len(leaves) > 1 else (False,):
        for leaf in leaves:
            token = _token(lines, leaf)
            new = None if token is None else _new_token(token, leaf.value, rng, far=far, regex=regex, vocab=vocab,
                                                        strict=strict)
            if new is not None and _changes(literal, leaf, ast.literal_eval(new)):
                return leaf.lineno, leaf.col_offset, leaf.end_col_offset, new
    return None


def _is_approx(node: ast.AST) -> bool:
    return _call_name(node) == "approx" and len(node.args) >= 1 and _is_literal(node.args[0])


def _swap_exception(name: ast.Name, rng: random.Random, vocab: _Vocabulary | None = None) -> Edit | None:
    """Another builtin exception, neither a subclass nor a superclass; with the module's ``vocab`` a
    plausible one: named elsewhere in the module when the original is, else a common one named nowhere."""
    if name.id not in _EXCEPTIONS:
        return None
    old = getattr(builtins, name.id)
    others = [e for e in _EXCEPTIONS
              if not issubclass(getattr(builtins, e), old) and not issubclass(old, getattr(builtins, e))]
    if vocab is not None:
        common = [e for e in others if e in _COMMON_EXCEPTIONS]
        if vocab.names[name.id] >= 2:
            likely = [e for e in others if vocab.names[e]]
        else:
            likely = [e for e in common if not vocab.names[e]]
        others = likely or common or others
    return name.lineno, name.col_offset, name.end_col_offset, rng.choice(others)


def _column(check: ast.AST, lines: list[bytes], rng: random.Random,
            vocab: _Vocabulary | None = None) -> Edit | None:
    """The level-1 edit of one check (None: it is not a mutable check); ``vocab``: the module's."""
    if isinstance(check, ast.Assert):
        test = check.test
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return None
        for side, other in ((test.comparators[0], test.left), (test.left, test.comparators[0])):
            if _is_literal(side) and not _is_literal(other):
                return _leaf_edit(side, lines, rng, vocab=vocab)
            if _is_approx(side) and not _is_literal(other):
                return _leaf_edit(side.args[0], lines, rng, far=True)
        return None
    name = _call_name(check)
    if name in ("assertEqual", "assertEquals") and len(check.args) >= 2:
        a, b = check.args[:2]
        if _is_literal(a) != _is_literal(b):
            return _leaf_edit(b if _is_literal(b) else a, lines, rng, vocab=vocab)
    if name == "raises" and check.args:
        match = next((k.value for k in check.keywords if k.arg == "match"), None)
        if isinstance(match, ast.Constant) and isinstance(match.value, str):
            if (edit := _leaf_edit(match, lines, rng, regex=True, vocab=vocab)) is not None:
                return edit
        if isinstance(check.args[0], ast.Name):
            return _swap_exception(check.args[0], rng, vocab)
    return None


def _statements(body: list[ast.stmt]):
    """The statements that run whenever ``body`` completes: its own, and those of the with-blocks whose
    context managers are all calls that catch nothing (any other with-statement is yielded, not its body)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.With, ast.AsyncWith)) and all(
                isinstance(item.context_expr, ast.Call) and _call_name(item.context_expr) not in _CATCHING
                for item in stmt.items):
            yield from _statements(stmt.body)


def _checks(func: ast.AST) -> list[ast.AST]:
    out: list[ast.AST] = []
    for stmt in _statements(func.body):
        if isinstance(stmt, (ast.Return, ast.Raise)):
            break
        if isinstance(stmt, ast.Assert):
            out.append(stmt)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            out.append(stmt.value)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            out += [item.context_expr for item in stmt.items if _call_name(item.context_expr) == "raises"]
    return out


def _columns(func: ast.AST, lines: list[bytes], rng: random.Random, max_columns: int) -> list[Edit]:
    """The level-1 edits of ``func``'s columns; ``lines``: the whole module's, whose vocabulary they draw on."""
    vocab = _vocabulary(b"".join(lines).decode("utf-8"))
    edits = [e for e in (_column(c, lines, rng, vocab) for c in _checks(func)) if e is not None]
    return rng.sample(edits, max_columns) if len(edits) > max_columns else edits


# --- the orthogonal array -----------------------------------------------------------------------------

def _design(m: int, rng: random.Random) -> list[list[int]]:
    """The 2**k rows (levels of the m columns) of the two-level strength-2 array; row 0 is all zeros,
    the last row all ones."""
    k = max(2, (m - 1).bit_length() + 1)
    odd = [c for c in range(1, 2 ** k) if bin(c).count("1") % 2]
    cols = rng.sample(odd, m)
    return [[bin(r & c).count("1") % 2 for c in cols] for r in range(2 ** k)]


# --- names, copies, canaries --------------------------------------------------------------------------

class _Names:
    """Fresh test names: ``test_`` + two words of the module's test names + a word and a number."""

    def __init__(self, source: str):
        words = {w for name in re.findall(r"^\s*(?:async\s+)?def test_(\w+)", source, re.M) for w in name.split("_")}
        self.words = sorted(w for w in words if w) or _DEFAULT_WORDS
        self.taken = set(re.findall(r"\w+", source))

    def __call__(self, rng: random.Random) -> str:
        tries = 0
        while True:
            picked = rng.sample(self.words, min(2, len(self.words)))
            name = "test_" + "_".join(picked + [rng.choice(self.words) + str(rng.randint(2, 99 + tries))])
            tries += 1
            if name not in self.taken:
                self.taken.add(name)
                return name


def _first_line(node: ast.AST) -> int:
    return min([d.lineno for d in node.decorator_list] + [node.lineno])


def _gap(body: list[ast.stmt], lines: list[bytes], default: int) -> int:
    """The usual number of blank lines between two functions / classes of ``body``."""
    defs = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    gaps = Counter(sum(not lines[i].strip() for i in range(a.end_lineno, _first_line(b) - 1))
                   for a, b in zip(defs, defs[1:]))
    return gaps.most_common(1)[0][0] if gaps else default


def _copy_text(lines: list[bytes], func: ast.AST, name: str, edits: list[Edit]) -> str:
    first = _first_line(func)
    m = re.search(rb"\bdef\s+(" + re.escape(func.name.encode()) + rb")\b", lines[func.lineno - 1])
    rename = (func.lineno, m.start(1), m.end(1), name)
    return b"".join(_apply(lines[first - 1:func.end_lineno], edits + [rename], first)).decode("utf-8")


def _canary_test(name: str, holds: bool, rng: random.Random) -> str:
    """A plain test (one of several forms, random data) whose assertion holds or, ``holds=False``, not."""
    values = rng.sample(range(10, 1000), rng.randint(3, 6))
    parts = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 6))) for _ in range(rng.randint(2, 5))]
    sep = rng.choice(["-", ", ", "/", ":", ""])
    forms = [
        (f"values = {values!r}", "sorted(values)", sorted(values)),
        (f"values = {values!r}", "sum(values)", sum(values)),
        (f"values = {values!r}", "max(values) - min(values)", max(values) - min(values)),
        (f"parts = {parts!r}", f"{sep!r}.join(parts)", sep.join(parts)),
        (f"parts = {parts!r}", "len(parts)", len(parts)),
        (f"text = {''.join(parts)!r}", "text.upper()", "".join(parts).upper()),
    ]
    setup, expr, value = rng.choice(forms)
    expected = repr(value)
    if not holds and isinstance(value, list):
        i, j = rng.sample(range(len(value)), 2)
        wrong = list(value)
        wrong[i], wrong[j] = wrong[j], wrong[i]
        expected = repr(wrong)
    elif not holds:
        expected = _new_token(expected, value, rng)
    return f"def {name}():\n    {setup}\n    assert {expr} == {expected}\n"


def _canaries(names: _Names, rng: random.Random) -> tuple[Canaries, list[str]]:
    """The canaries and their two texts, in a random order."""
    ok, bad = names(rng), names(rng)
    texts = [_canary_test(ok, True, rng), _canary_test(bad, False, rng)]
    rng.shuffle(texts)
    return Canaries(ok, bad), texts


def _unparsed(source: str, f2p_keys: list[str], rng: random.Random) -> ModuleVariant:
    canaries, texts = _canaries(_Names(source), rng)
    tail = "" if source.endswith("\n") or not source else "\n"
    variant = source + tail + "".join("\n\n" + t for t in texts)
    return ModuleVariant(variant, {k: [Copy(k.split("::")[-1], "real")] for k in f2p_keys}, canaries, source,
                         list(f2p_keys))


# --- the variant --------------------------------------------------------------------------------------

def _canary_gaps(tree: ast.Module) -> list[int]:
    """Lines after which a canary may go: the ends of the top-level statements from the last import on."""
    body = tree.body
    imports = [i for i, n in enumerate(body) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return [n.end_lineno for n in body[imports[-1] if imports else 0:]] or [0]


def build_variant(source: str, f2p: list[str], rng: random.Random, *, max_columns: int = 8) -> ModuleVariant:
    """See the module doc."""
    keys = list(dict.fromkeys(name.split("[", 1)[0] for name in f2p))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return _unparsed(source, keys, rng)
    nl = "\r\n" if "\r\n" in source else "\n"
    lines = source.encode("utf-8").splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += nl.encode()
    funcs, names = _functions(tree), _Names(source)
    top_gap = _gap(tree.body, lines, 2)
    class_gaps = {sub: _gap(n.body, lines, 1) for n in tree.body if isinstance(n, ast.ClassDef) for sub in n.body}
    copies: dict[str, list[Copy]] = {}
    blocks: dict[int, tuple[int, str]] = {}  # first line of a function: (its last line, the block of copies)
    decoy_edits: list[Edit] = []
    unmutated: list[str] = []
    for key in keys:
        func = funcs.get(key)
        if func is None:
            copies[key] = [Copy(key.split("::")[-1], "real")]
            unmutated.append(key)
            continue
        columns = _columns(func, lines, rng, max_columns)
        rows = _design(len(columns), rng) if columns else [[]]
        if not columns:
            unmutated.append(key)
        decoy_edits += columns
        texts, copies[key] = [], []
        for r, row in enumerate(rows):
            role = "real" if not any(row) else "decoy" if r == len(rows) - 1 else "mutant"
            name = names(rng)
            texts.append(_copy_text(lines, func, name, [e for e, level in zip(columns, row) if level]))
            copies[key].append(Copy(name, role))
        order = rng.sample(range(len(rows)), len(rows))
        copies[key] = [copies[key][i] for i in order]
        sep = nl * class_gaps.get(func, top_gap)
        blocks[_first_line(func)] = (func.end_lineno, sep.join(texts[i] for i in order))
    canaries, canary_texts = _canaries(names, rng)
    gaps = _canary_gaps(tree)
    inserts: dict[int, list[str]] = {}
    for text in canary_texts:
        after = rng.choice(gaps)
        follows = lines[after] if after < len(lines) else b""
        tail = nl * top_gap if follows.strip() else ""
        inserts.setdefault(after, []).append(nl * top_gap + text.replace("\n", nl) + tail)
    out = inserts.get(0, [])
    i = 1
    while i <= len(lines):
        last, text = blocks.get(i, (i, lines[i - 1].decode("utf-8")))
        out.append(text)
        for line in range(i, last + 1):
            out += inserts.get(line, [])
        i = last + 1
    decoy = source if not decoy_edits else b"".join(_apply(source.encode("utf-8").splitlines(keepends=True),
                                                            decoy_edits)).decode("utf-8")
    return ModuleVariant("".join(out), copies, canaries, decoy, unmutated)
