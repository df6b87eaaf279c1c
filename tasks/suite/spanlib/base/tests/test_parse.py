import pytest

from spanlib import Interval, format_interval, parse_interval


def test_parse_brackets():
    assert parse_interval("[1, 5)") == Interval(1, 5)
    assert parse_interval("(1,5]") == Interval(1, 5, False, True)


def test_parse_numbers():
    iv = parse_interval(" [-2.5, 1e3 ] ")
    assert (iv.lo, iv.hi) == (-2.5, 1000.0)
    assert isinstance(parse_interval("[1, 2]").lo, int)


def test_parse_rejects_garbage():
    for text in ("1, 2", "[1 2]", "[a, b]", "[3, 1]"):
        with pytest.raises(ValueError):
            parse_interval(text)


def test_format_roundtrip():
    for text in ("[1, 5)", "(0, 2.5]", "[-3, -1]"):
        assert format_interval(parse_interval(text)) == text
