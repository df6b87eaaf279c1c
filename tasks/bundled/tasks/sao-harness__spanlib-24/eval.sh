#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff 0922a3a8a908fe086d89893e2f558a7af60dbcff
git checkout 0922a3a8a908fe086d89893e2f558a7af60dbcff -- tests/test_daterange.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_daterange.py b/tests/test_daterange.py
index 06134a9ade32..187dfac34c40 100644
--- a/tests/test_daterange.py
+++ b/tests/test_daterange.py
@@ -73,6 +73,70 @@ def test_split_by_month():
     ]
 
 
+def test_split_by_week_starts_on_monday():
+    r = DateRange(date(2024, 3, 6), date(2024, 3, 20))
+    assert r.split("week") == [
+        DateRange(date(2024, 3, 6), date(2024, 3, 10)),
+        DateRange(date(2024, 3, 11), date(2024, 3, 17)),
+        DateRange(date(2024, 3, 18), date(2024, 3, 20)),
+    ]
+
+
+def test_split_by_week_with_sunday_start():
+    r = DateRange(date(2024, 3, 6), date(2024, 3, 20))
+    assert r.split("week", week_start=6) == [
+        DateRange(date(2024, 3, 6), date(2024, 3, 9)),
+        DateRange(date(2024, 3, 10), date(2024, 3, 16)),
+        DateRange(date(2024, 3, 17), date(2024, 3, 20)),
+    ]
+
+
+def test_split_by_quarter_and_year():
+    r = DateRange(date(2024, 2, 15), date(2024, 8, 1))
+    assert r.split("quarter") == [
+        DateRange(date(2024, 2, 15), date(2024, 3, 31)),
+        DateRange(date(2024, 4, 1), date(2024, 6, 30)),
+        DateRange(date(2024, 7, 1), date(2024, 8, 1)),
+    ]
+    r = DateRange(date(2023, 12, 30), date(2025, 1, 2))
+    assert [str(p) for p in r.split("year")] == [
+        "2023-12-30..2023-12-31",
+        "2024-01-01..2024-12-31",
+        "2025-01-01..2025-01-02",
+    ]
+
+
+def test_split_by_day_and_default():
+    r = DateRange(date(2024, 2, 28), date(2024, 3, 1))
+    assert [len(p) for p in r.split("day")] == [1, 1, 1]
+    assert r.split() == r.split_by_month() == r.split("month")
+
+
+def test_split_pieces_cover_the_range():
+    r = DateRange(date(2023, 1, 1), date(2024, 12, 31))
+    for unit in ("day", "week", "month", "quarter", "year"):
+        pieces = r.split(unit)
+        assert pieces[0].start == r.start and pieces[-1].end == r.end
+        assert sum(len(p) for p in pieces) == len(r)
+
+
+def test_split_rejects_bad_arguments():
+    r = DateRange(date(2024, 1, 1), date(2024, 1, 31))
+    with pytest.raises(ValueError, match="fortnight"):
+        r.split("fortnight")
+    with pytest.raises(ValueError, match="week_start"):
+        r.split("week", week_start=7)
+
+
+def test_period_end():
+    from spanlib import UNITS, period_end
+
+    assert UNITS == ("day", "week", "month", "quarter", "year")
+    assert period_end(date(2024, 5, 8), "quarter") == date(2024, 6, 30)
+    assert period_end(date(2024, 3, 10), "week") == date(2024, 3, 10)
+    assert period_end(date(2024, 3, 10), "week", week_start=6) == date(2024, 3, 16)
+
+
 def test_overlap_and_shift():
     a = DateRange(date(2024, 1, 1), date(2024, 1, 10))
     b = DateRange(date(2024, 1, 8), date(2024, 1, 20))
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_daterange.py
: '>>>>> End Test Output'
git checkout 0922a3a8a908fe086d89893e2f558a7af60dbcff -- tests/test_daterange.py
