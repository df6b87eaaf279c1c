from datetime import date

import pytest

from spanlib import DateRange, Interval, add_months, month_end


def test_length_iteration_and_membership():
    r = DateRange(date(2024, 2, 27), date(2024, 3, 2))
    assert len(r) == 5
    assert list(r)[2] == date(2024, 2, 29)
    assert date(2024, 3, 2) in r and date(2024, 3, 3) not in r


def test_end_before_start():
    with pytest.raises(ValueError):
        DateRange(date(2024, 1, 2), date(2024, 1, 1))


def test_parse_and_str():
    r = DateRange.parse("2024-01-01..2024-01-31")
    assert r == DateRange.month(2024, 1)
    assert DateRange.parse("2024-01-01/2024-01-31") == r
    assert str(r) == "2024-01-01..2024-01-31"
    with pytest.raises(ValueError):
        DateRange.parse("January")


def test_add_months_clamps():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)
    assert add_months(date(2024, 11, 15), 3) == date(2025, 2, 15)
    assert add_months(date(2024, 3, 31), -1) == date(2024, 2, 29)


def test_month_end():
    assert month_end(date(2024, 2, 10)) == date(2024, 2, 29)


def test_step_days_and_weeks():
    r = DateRange(date(2024, 3, 1), date(2024, 3, 20))
    assert list(r.step(weeks=1)) == [date(2024, 3, 1), date(2024, 3, 8), date(2024, 3, 15)]
    assert len(list(r.step(days=10))) == 2


def test_step_months_from_the_first():
    r = DateRange(date(2024, 1, 1), date(2024, 4, 30))
    assert list(r.step(months=1)) == [date(2024, m, 1) for m in (1, 2, 3, 4)]


def test_step_must_be_positive():
    r = DateRange(date(2024, 1, 1), date(2024, 1, 5))
    with pytest.raises(ValueError):
        list(r.step())
    with pytest.raises(ValueError):
        list(r.step(days=-1))


def test_weekdays_and_business_days():
    r = DateRange(date(2024, 3, 1), date(2024, 3, 31))
    assert len(list(r.weekdays())) == 21
    assert r.business_days() == 21
    assert r.business_days([date(2024, 3, 29)]) == 20
    assert r.business_days([date(2024, 4, 1)]) == 21


def test_split_by_month():
    r = DateRange(date(2024, 1, 20), date(2024, 3, 5))
    assert r.split_by_month() == [
        DateRange(date(2024, 1, 20), date(2024, 1, 31)),
        DateRange(date(2024, 2, 1), date(2024, 2, 29)),
        DateRange(date(2024, 3, 1), date(2024, 3, 5)),
    ]


def test_overlap_and_shift():
    a = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    b = DateRange(date(2024, 1, 8), date(2024, 1, 20))
    assert a.overlap(b) == DateRange(date(2024, 1, 8), date(2024, 1, 10))
    assert a.overlap(b.shift(10)) is None


def test_to_interval():
    r = DateRange(date(2024, 1, 1), date(2024, 1, 2))
    assert r.to_interval() == Interval(date(2024, 1, 1), date(2024, 1, 3))
