from tablefmt import STYLES, get_style, tabulate
from tablefmt.styles import Rule, rule_cells


def test_markdown_is_an_alias_of_pipe():
    assert get_style("markdown") is STYLES["pipe"]


def test_get_style_passes_style_objects_through():
    assert get_style(STYLES["grid"]) is STYLES["grid"]


def test_pipe_style_marks_left_and_right():
    out = tabulate([["a", 1]], ["name", "n"], style="pipe")
    assert out == "| name | n |\n|:-----|--:|\n| a    | 1 |"


def test_rule_cells_without_markers():
    rule = Rule("+", "-", "+", "+")
    assert rule_cells(rule, [3, 2], ["left", "right"], markers=False) == ["---", "--"]


def test_float_column_decimal_alignment():
    out = tabulate([[1.5], [10.25]], ["v"], style="plain")
    assert out.splitlines() == ["    v", " 1.5", "10.25"]


def test_every_style_renders():
    for name in sorted(STYLES):
        out = tabulate([["a", 1], ["b", 2]], ["x", "y"], style=name)
        assert "a" in out and "b" in out, name
