import pytest

from minicfg.errors import DuplicateKeyError, ParseError
from minicfg.parser import parse, parse_value, unescape


def test_sections_and_entries():
    sections = parse("[a]\nx = 1\ny: two\n\n[b]\nz=3\n")
    assert [s.name for s in sections] == ["a", "b"]
    assert sections[0].as_dict() == {"x": "1", "y": "two"}
    assert sections[1].as_dict() == {"z": "3"}


def test_keys_are_lowercased_sections_keep_case():
    (section,) = parse("[Server]\nHostName = example.org\n")
    assert section.name == "Server"
    assert section.as_dict() == {"hostname": "example.org"}


def test_full_line_comments_are_ignored():
    (section,) = parse("# leading\n[a]\n; semicolon\nx = 1\n  # indented comment\n")
    assert section.as_dict() == {"x": "1"}


def test_inline_comment_needs_whitespace():
    (section,) = parse("[a]\ncolor = red # the default\nurl = http://host/#anchor\n")
    assert section.as_dict() == {"color": "red", "url": "http://host/#anchor"}


def test_double_quoted_value_keeps_comment_characters():
    (section,) = parse('[a]\nmotd = "hello ; world"  ; comment\n')
    assert section.as_dict() == {"motd": "hello ; world"}


def test_double_quotes_understand_escapes():
    value, quoted = parse_value(r'"tab\there \"q\" back\\slash"')
    assert quoted is True
    assert value == 'tab\there "q" back\\slash'


def test_single_quotes_are_literal():
    value, quoted = parse_value(r"'C:\temp\new'")
    assert quoted is True
    assert value == r"C:\temp\new"


def test_unterminated_string_is_an_error():
    with pytest.raises(ParseError) as info:
        parse('[a]\nx = "open\n')
    assert info.value.lineno == 2
    assert "unterminated" in str(info.value)


def test_unknown_escape_is_an_error():
    with pytest.raises(ParseError, match="unknown escape"):
        unescape(r"\q", lineno=3)


def test_continuation_lines():
    text = "[a]\nbanner =\n    first line\n    second line\nnext = 1\n"
    (section,) = parse(text)
    assert section.as_dict() == {"banner": "first line\nsecond line", "next": "1"}


def test_blank_line_ends_continuation():
    (section,) = parse("[a]\nx = 1\n\n    y = 2\n")
    assert section.as_dict() == {"x": "1", "y": "2"}


def test_key_outside_section():
    with pytest.raises(ParseError, match="outside of any section") as info:
        parse("x = 1\n[a]\n", source="app.cfg")
    assert str(info.value).startswith("app.cfg:1:")


def test_duplicate_key_strict_and_lenient():
    text = "[a]\nx = 1\nX = 2\n"
    with pytest.raises(DuplicateKeyError):
        parse(text)
    (section,) = parse(text, strict=False)
    assert section.as_dict() == {"x": "2"}


def test_repeated_section_is_merged():
    sections = parse("[a]\nx = 1\n[b]\ny = 2\n[a]\nz = 3\n")
    assert [s.name for s in sections] == ["a", "b"]
    assert sections[0].as_dict() == {"x": "1", "z": "3"}

