from datetime import date

import pytest

from spanlib import Interval


def test_default_is_half_open():
    iv = Interval(1, 5)
    assert 1 in iv and 4.999 in iv and 5 not in iv
    assert iv.brackets == "[)"


def test_constructors():
    assert Interval.closed(1, 2).brackets == "[]"
    assert Interval.open(1, 2).brackets == "()"
    assert 3 in Interval.point(3)


def test_bounds_must_be_ordered():
    with pytest.raises(ValueError, match="out of order"):
        Interval(5, 1)


def test_empty_intervals():
    assert Interval(3, 3).is_empty
    assert Interval.open(3, 3).is_empty
    assert not Interval.point(3).is_empty


def test_overlaps():
    assert Interval(1, 5).overlaps(Interval(4, 8))
    assert Interval(1, 5).overlaps(Interval(2, 3))
    assert not Interval(1, 2).overlaps(Interval(5, 6))
    assert Interval.closed(1, 3).overlaps(Interval.closed(3, 5))
    assert not Interval(1, 3).overlaps(Interval(3, 3))


def test_adjacent():
    assert Interval(1, 3).is_adjacent(Interval(3, 5))
    assert Interval(3, 5).is_adjacent(Interval(1, 3))
    assert not Interval.open(1, 3).is_adjacent(Interval.open(3, 5))
    assert not Interval(1, 3).is_adjacent(Interval(4, 5))


def test_contains_interval():
    outer = Interval(0, 10)
    assert outer.contains_interval(Interval(0, 10))
    assert outer.contains_interval(Interval.open(0, 10))
    assert not outer.contains_interval(Interval.closed(0, 10))
    assert outer.contains_interval(Interval(20, 20))


def test_intersection():
    assert Interval(1, 5).intersection(Interval(3, 8)) == Interval(3, 5)
    assert Interval.closed(1, 5).intersection(Interval.open(1, 5)) == Interval.open(1, 5)
    assert Interval(1, 2).intersection(Interval(3, 4)) is None


def test_union_and_hull():
    assert Interval(1, 3).union(Interval(3, 5)) == Interval(1, 5)
    assert Interval(1, 4).union(Interval(2, 3)) == Interval(1, 4)
    with pytest.raises(ValueError, match="disjoint"):
        Interval(1, 2).union(Interval(3, 4))
    assert Interval(1, 2).hull(Interval.closed(3, 4)) == Interval.closed(1, 4)


def test_dates_and_shift():
    week = Interval(date(2024, 3, 4), date(2024, 3, 11))
    assert week.length.days == 7
    assert date(2024, 3, 10) in week
    assert week.shift(week.length) == Interval(date(2024, 3, 11), date(2024, 3, 18))


def test_ordering_equality_and_hash():
    items = [Interval(3, 4), Interval(1, 9), Interval.open(1, 2), Interval(1, 2)]
    assert sorted(items) == [Interval(1, 2), Interval(1, 9), Interval.open(1, 2), Interval(3, 4)]
    assert len({Interval(1, 2), Interval(1, 2), Interval.closed(1, 2)}) == 2


def test_repr_and_str():
    assert repr(Interval(1, 2.5)) == "Interval(1, 2.5, '[)')"
    assert str(Interval.open(0, 1)) == "(0, 1)"
