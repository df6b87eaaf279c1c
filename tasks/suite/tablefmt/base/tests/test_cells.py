from decimal import Decimal

from tablefmt.cells import FLOAT, INT, TEXT, align_decimal, column_type, format_cell, is_number


def test_is_number():
    assert is_number(3) and is_number(2.5) and is_number(Decimal("1.1"))
    assert is_number(" 42 ") and is_number("1_000") and is_number("-3.5e2")
    assert not is_number(True)
    assert not is_number("nan") and not is_number("") and not is_number("abc")


def test_column_type():
    assert column_type([1, 2, "3"]) == INT
    assert column_type([1, 2.5]) == FLOAT
    assert column_type([1, "x"]) == TEXT
    assert column_type([True, False]) == TEXT


def test_missing_values_do_not_change_column_type():
    assert column_type([1, None, 3]) == INT
    assert column_type([None, None]) == TEXT


def test_format_cell():
    assert format_cell(None, missing="-") == "-"
    assert format_cell(0.5, FLOAT, ".2f") == "0.50"
    assert format_cell("2.25", FLOAT, ".1f") == "2.2"
    assert format_cell(" 7 ", INT) == "7"
    assert format_cell("text") == "text"


def test_align_decimal_on_points():
    assert align_decimal(["1.5", "10.25", "100.125"]) == [
        "  1.5  ",
        " 10.25 ",
        "100.125",
    ]


def test_align_decimal_keeps_missing_cells_empty():
    assert align_decimal(["1.5", "", "22.75"]) == [" 1.5 ", "", "22.75"]
