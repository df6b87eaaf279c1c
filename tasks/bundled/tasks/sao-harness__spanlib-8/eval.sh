#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff 0922a3a8a908fe086d89893e2f558a7af60dbcff
git checkout 0922a3a8a908fe086d89893e2f558a7af60dbcff -- tests/test_intervalset.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_intervalset.py b/tests/test_intervalset.py
index e041a917dd78..3caca5309ede 100644
--- a/tests/test_intervalset.py
+++ b/tests/test_intervalset.py
@@ -50,6 +50,25 @@ def test_discard_whole_intervals():
     assert list(s) == [Interval(0, 1), Interval(4, 5)]
 
 
+def test_discard_splits_an_interval():
+    s = IntervalSet([Interval(0, 10)])
+    s.discard(Interval(3, 5))
+    assert list(s) == [Interval(0, 3), Interval(5, 10)]
+    assert 4 not in s and 7 in s
+
+
+def test_discard_point_from_closed_interval():
+    s = IntervalSet([Interval.closed(0, 10)])
+    s.discard(Interval.point(5))
+    assert list(s) == [Interval(0, 5), Interval(5, 10, False, True)]
+
+
+def test_difference_with_holes():
+    day = IntervalSet([Interval(8, 18)])
+    busy = IntervalSet([Interval(9, 10), Interval(13, 14)])
+    assert list(day - busy) == [Interval(8, 9), Interval(10, 13), Interval(14, 18)]
+
+
 def test_union_and_intersection():
     a = IntervalSet([Interval(0, 4), Interval(6, 9)])
     b = IntervalSet([Interval(3, 7)])
@@ -62,6 +81,15 @@ def test_complement_at_the_edges():
     assert list(s.complement(Interval(0, 10))) == [Interval(2, 8)]
 
 
+def test_complement_with_interior_intervals():
+    busy = IntervalSet([Interval(9, 12), Interval(14, 15)])
+    assert list(busy.complement(Interval(8, 18))) == [
+        Interval(8, 9),
+        Interval(12, 14),
+        Interval(15, 18),
+    ]
+
+
 def test_span_and_total_length():
     s = IntervalSet([Interval(1, 2), Interval(4, 7)])
     assert s.span() == Interval(1, 7)
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_intervalset.py
: '>>>>> End Test Output'
git checkout 0922a3a8a908fe086d89893e2f558a7af60dbcff -- tests/test_intervalset.py
