import pytest

from tablefmt.width import char_width, display_width, pad, strip_ansi, truncate


def test_ascii_width():
    assert display_width("hello") == 5
    assert display_width("") == 0


def test_wide_and_combining_characters():
    assert char_width("\u4e2d") == 2  # CJK ideograph
    assert char_width("\u0301") == 0  # combining acute accent
    assert display_width("cafe\u0301") == 4
    assert display_width("\u65e5\u672c\u8a9e") == 6
    assert display_width("a\u200bb") == 2


def test_strip_simple_colours():
    assert strip_ansi("\x1b[31mred\x1b[0m") == "red"
    assert display_width("\x1b[1mbold\x1b[0m") == 4


@pytest.mark.parametrize(
    "align, expected",
    [("left", "ab   "), ("right", "   ab"), ("center", " ab  ")],
    ids=["left", "right", "center"],
)
def test_pad(align, expected):
    assert pad("ab", 5, align) == expected


def test_pad_never_truncates():
    assert pad("abcdef", 3) == "abcdef"


def test_pad_rejects_unknown_alignment():
    with pytest.raises(ValueError):
        pad("x", 3, "justify")


def test_truncate():
    assert truncate("abcdefgh", 5) == "abcd\u2026"
    assert truncate("abc", 5) == "abc"
    assert truncate("\u65e5\u672c\u8a9e", 4) == "\u65e5\u2026"
