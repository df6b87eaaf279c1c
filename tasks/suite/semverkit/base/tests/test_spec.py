import pytest

from semverkit import InvalidRange, Range, satisfies


def matching(range_text, versions):
    return [str(v) for v in Range(range_text).filter(versions)]


VERSIONS = ["0.9.0", "1.0.0", "1.2.3", "1.2.9", "1.3.0", "1.9.9", "2.0.0", "2.5.1", "3.0.0"]


def test_comparators():
    assert matching(">=1.2.3 <2.0.0", VERSIONS) == ["1.2.3", "1.2.9", "1.3.0", "1.9.9"]
    assert matching("=1.3.0", VERSIONS) == ["1.3.0"]
    assert matching("1.3.0", VERSIONS) == ["1.3.0"]
    assert matching(">2.0.0", VERSIONS) == ["2.5.1", "3.0.0"]


def test_caret_ranges():
    assert matching("^1.2.3", VERSIONS) == ["1.2.3", "1.2.9", "1.3.0", "1.9.9"]
    assert matching("^2", VERSIONS) == ["2.0.0", "2.5.1"]


def test_tilde_ranges():
    assert matching("~1.2.3", VERSIONS) == ["1.2.3", "1.2.9"]
    assert matching("~1", VERSIONS) == ["1.0.0", "1.2.3", "1.2.9", "1.3.0", "1.9.9"]


def test_x_ranges():
    assert matching("1.2.x", VERSIONS) == ["1.2.3", "1.2.9"]
    assert matching("2.*", VERSIONS) == ["2.0.0", "2.5.1"]
    assert matching("*", VERSIONS) == VERSIONS
    assert matching("", VERSIONS) == VERSIONS


def test_partial_bounds():
    assert matching(">1.2", VERSIONS) == ["1.3.0", "1.9.9", "2.0.0", "2.5.1", "3.0.0"]
    assert matching("<=1.2", VERSIONS) == ["0.9.0", "1.0.0", "1.2.3", "1.2.9"]
    assert matching("<1.2", VERSIONS) == ["0.9.0", "1.0.0"]


def test_hyphen_ranges():
    assert matching("1.0.0 - 1.3.0", VERSIONS) == ["1.0.0", "1.2.3", "1.2.9", "1.3.0"]
    assert matching("1.2 - 2", VERSIONS) == ["1.2.3", "1.2.9", "1.3.0", "1.9.9", "2.0.0", "2.5.1"]


def test_or_ranges():
    assert matching("<1.0.0 || >=2.5.0", VERSIONS) == ["0.9.0", "2.5.1", "3.0.0"]


def test_spaces_after_operators():
    assert Range(">= 1.2.3 < 1.3").contains("1.2.9")


def test_str_and_repr():
    assert str(Range("~1.2.3 || 2.x")) == ">=1.2.3 <1.3.0 || >=2.0.0 <3.0.0"
    assert str(Range("*")) == "*"
    assert repr(Range("^1")) == "Range('^1')"


def test_max_and_min_satisfying():
    r = Range("^1.2.0 || >=3.0.0 <3.5.0")
    assert str(r.max_satisfying(["1.2.0", "1.8.1", "3.4.0", "3.6.0"])) == "3.4.0"
    assert str(r.min_satisfying(["3.6.0", "1.8.1", "3.4.0"])) == "1.8.1"
    assert r.max_satisfying(["0.1.0"]) is None


def test_contains_operator_and_shortcut():
    assert "1.5.0" in Range("^1")
    assert satisfies("2.0.0", ">=2")
    assert not satisfies("1.0.0", ">=2")


def test_invalid_ranges():
    for text in (">=banana", "^1.2.3.4", "1.2.3 - "):
        with pytest.raises(InvalidRange):
            Range(text)
