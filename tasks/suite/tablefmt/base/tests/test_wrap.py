import pytest

from tablefmt.wrap import wrap_cell, wrap_text


def test_wrap_words():
    assert wrap_text("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_breaks_long_words():
    assert wrap_text("abcdefghij", 4) == ["abcd", "efgh", "ij"]


def test_wrap_collapses_whitespace():
    assert wrap_text("a   b\tc", 80) == ["a b c"]


def test_wrap_empty_text():
    assert wrap_text("", 5) == [""]


def test_wrap_rejects_zero_width():
    with pytest.raises(ValueError):
        wrap_text("x", 0)


def test_wrap_cell_keeps_newlines():
    assert wrap_cell("one two\nthree", 5) == ["one", "two", "three"]
    assert wrap_cell("a\nb", None) == ["a", "b"]
