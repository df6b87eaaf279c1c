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
index 06134a9ade32..8a884bcc6613 100644
--- a/tests/test_daterange.py
+++ b/tests/test_daterange.py
@@ -48,6 +48,34 @@ def test_step_months_from_the_first():
     assert list(r.step(months=1)) == [date(2024, m, 1) for m in (1, 2, 3, 4)]
 
 
+def test_step_months_from_the_end_of_a_month():
+    r = DateRange(date(2024, 1, 31), date(2024, 6, 30))
+    assert list(r.step(months=1)) == [
+        date(2024, 1, 31),
+        date(2024, 2, 29),
+        date(2024, 3, 31),
+        date(2024, 4, 30),
+        date(2024, 5, 31),
+        date(2024, 6, 30),
+    ]
+
+
+def test_step_quarters_keeps_the_day_of_month():
+    r = DateRange(date(2023, 11, 30), date(2024, 12, 31))
+    assert list(r.step(months=3)) == [
+        date(2023, 11, 30),
+        date(2024, 2, 29),
+        date(2024, 5, 30),
+        date(2024, 8, 30),
+        date(2024, 11, 30),
+    ]
+
+
+def test_step_months_stops_at_the_end():
+    r = DateRange(date(2024, 1, 31), date(2024, 3, 30))
+    assert list(r.step(months=1)) == [date(2024, 1, 31), date(2024, 2, 29)]
+
+
 def test_step_must_be_positive():
     r = DateRange(date(2024, 1, 1), date(2024, 1, 5))
     with pytest.raises(ValueError):
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_daterange.py
: '>>>>> End Test Output'
git checkout 0922a3a8a908fe086d89893e2f558a7af60dbcff -- tests/test_daterange.py
