import pytest

from tablefmt import Table, tabulate

ROWS = [["apple", 3, 1.5], ["kiwi", 12, 0.25], ["fig", 100, 2.5]]
HEADERS = ["fruit", "qty", "price"]


def test_simple_style():
    assert tabulate(ROWS, HEADERS) == (
        "fruit  qty  price\n"
        "-----  ---  -----\n"
        "apple    3   1.5\n"
        "kiwi    12   0.25\n"
        "fig    100   2.5"
    )


def test_plain_style_without_headers():
    assert tabulate([["a", 1], ["bb", 22]], style="plain") == "a    1\nbb  22"


def test_grid_style():
    out = tabulate([["a", 1]], ["x", "y"], style="grid")
    assert out == (
        "+---+---+\n"
        "| x | y |\n"
        "+===+===+\n"
        "| a | 1 |\n"
        "+---+---+"
    )


def test_rst_style():
    out = tabulate([["a", 1]], ["name", "n"], style="rst")
    assert out == "====  =\nname  n\n====  =\na     1\n====  ="


def test_explicit_alignment():
    out = tabulate([["a", "b"], ["ccc", "ddd"]], ["l", "r"], align=["center", "right"])
    assert out.splitlines()[2:] == [" a     b", "ccc  ddd"]


def test_unknown_alignment_is_rejected():
    with pytest.raises(ValueError, match="justify"):
        tabulate([["a"]], align="justify")


def test_too_many_alignments_are_rejected():
    with pytest.raises(ValueError, match="align"):
        tabulate([["a"]], align=["left", "right"])


def test_missing_values_and_short_rows():
    t = Table([["a", 1], ["b"], ["c", None]], ["k", "v"], missing="-")
    assert t.render("plain").splitlines() == ["k  v", "a  1", "b  -", "c  -"]


def test_unknown_style():
    with pytest.raises(ValueError, match="unknown table style"):
        tabulate([["a"]], style="fancy")


def test_maxcolwidths_wraps_cells():
    rows = [["the quick brown fox", 1]]
    out = tabulate(rows, ["text", "n"], style="grid", maxcolwidths=[9, None])
    assert out.splitlines()[3:6] == [
        "| the quick | 1 |",
        "| brown fox |   |",
        "+-----------+---+",
    ]


def test_multiline_cells():
    out = tabulate([["a\nb", "x"]], style="plain")
    assert out.splitlines() == ["a  x", "b"]


def test_str_uses_simple_style():
    t = Table([["a", 1]], ["k", "v"])
    assert str(t) == t.render("simple")


def test_add_row_and_ncols():
    t = Table(headers=["a"])
    t.add_row([1, 2, 3])
    assert t.ncols == 3
    assert t.column(2) == [3]
