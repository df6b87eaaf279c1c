from datetime import date, timedelta

from spanlib import Interval, IntervalSet


def test_overlapping_intervals_merge():
    s = IntervalSet([Interval(1, 3), Interval(2, 5), Interval(8, 9)])
    assert list(s) == [Interval(1, 5), Interval(8, 9)]


def test_adjacent_intervals_merge():
    s = IntervalSet([Interval(3, 5), Interval(1, 3)])
    assert list(s) == [Interval(1, 5)]


def test_open_gap_is_kept():
    s = IntervalSet([Interval.open(1, 3), Interval.open(3, 5)])
    assert len(s) == 2
    assert 3 not in s


def test_bridging_interval_merges_everything():
    s = IntervalSet([Interval(0, 1), Interval(2, 3), Interval(4, 5)])
    s.add(Interval(0.5, 4.5))
    assert list(s) == [Interval(0, 5)]


def test_empty_intervals_are_ignored():
    s = IntervalSet([Interval(2, 2)])
    assert not s
    assert s.span() is None


def test_membership():
    s = IntervalSet([Interval(0, 2), Interval.closed(5, 6)])
    assert 0 in s and 1.5 in s and 6 in s
    assert 2 not in s and 4 not in s and -1 not in s


def test_discard_trims_edges():
    s = IntervalSet([Interval(0, 10)])
    s.discard(Interval(8, 20))
    s.discard(Interval(-5, 2))
    assert list(s) == [Interval(2, 8)]


def test_discard_whole_intervals():
    s = IntervalSet([Interval(0, 1), Interval(2, 3), Interval(4, 5)])
    s.discard(Interval(1, 4))
    assert list(s) == [Interval(0, 1), Interval(4, 5)]


def test_union_and_intersection():
    a = IntervalSet([Interval(0, 4), Interval(6, 9)])
    b = IntervalSet([Interval(3, 7)])
    assert list(a | b) == [Interval(0, 9)]
    assert list(a & b) == [Interval(3, 4), Interval(6, 7)]


def test_complement_at_the_edges():
    s = IntervalSet([Interval(0, 2), Interval(8, 10)])
    assert list(s.complement(Interval(0, 10))) == [Interval(2, 8)]


def test_span_and_total_length():
    s = IntervalSet([Interval(1, 2), Interval(4, 7)])
    assert s.span() == Interval(1, 7)
    assert s.total_length() == 4


def test_dates():
    d = date(2024, 1, 1)
    three, five = d + timedelta(days=3), d + timedelta(days=5)
    s = IntervalSet([Interval(d, three), Interval(three, five)])
    assert len(s) == 1
    assert s.total_length(timedelta(0)) == timedelta(days=5)
