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
index 06134a9ade32..fc582eee6513 100644
--- a/tests/test_daterange.py
+++ b/tests/test_daterange.py
@@ -64,6 +64,19 @@ def test_weekdays_and_business_days():
     assert r.business_days([date(2024, 4, 1)]) == 21
 
 
+def test_holidays_on_weekends_are_not_subtracted():
+    r = DateRange(date(2024, 3, 1), date(2024, 3, 31))
+    assert r.business_days([date(2024, 3, 2), date(2024, 3, 29)]) == 20
+    assert r.business_days([date(2024, 3, 30), date(2024, 3, 31)]) == 21
+
+
+def test_duplicate_holidays_count_once():
+    r = DateRange(date(2024, 12, 23), date(2024, 12, 31))
+    holidays = [date(2024, 12, 25), date(2024, 12, 26), date(2024, 12, 25)]
+    assert r.business_days(holidays) == 5
+    assert r.business_days(iter(holidays)) == 5
+
+
 def test_split_by_month():
     r = DateRange(date(2024, 1, 20), date(2024, 3, 5))
     assert r.split_by_month() == [
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_daterange.py
: '>>>>> End Test Output'
git checkout 0922a3a8a908fe086d89893e2f558a7af60dbcff -- tests/test_daterange.py
