#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff 0922a3a8a908fe086d89893e2f558a7af60dbcff
git checkout 0922a3a8a908fe086d89893e2f558a7af60dbcff -- tests/test_interval.py tests/test_intervalset.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_interval.py b/tests/test_interval.py
index c5cb1393ef23..78dfacbc4453 100644
--- a/tests/test_interval.py
+++ b/tests/test_interval.py
@@ -36,6 +36,18 @@ def test_overlaps():
     assert not Interval(1, 3).overlaps(Interval(3, 3))
 
 
+def test_touching_half_open_intervals_do_not_overlap():
+    assert not Interval(1, 3).overlaps(Interval(3, 5))
+    assert not Interval(3, 5).overlaps(Interval(1, 3))
+    assert not Interval(1, 3, False, True).overlaps(Interval.open(3, 5))
+    assert Interval(1, 3, False, True).overlaps(Interval.closed(3, 5))
+
+
+def test_intersection_of_touching_intervals_is_none():
+    assert Interval(1, 3).intersection(Interval(3, 5)) is None
+    assert Interval.closed(1, 3).intersection(Interval.closed(3, 5)) == Interval.point(3)
+
+
 def test_adjacent():
     assert Interval(1, 3).is_adjacent(Interval(3, 5))
     assert Interval(3, 5).is_adjacent(Interval(1, 3))
diff --git a/tests/test_intervalset.py b/tests/test_intervalset.py
index e041a917dd78..b04132c8a58b 100644
--- a/tests/test_intervalset.py
+++ b/tests/test_intervalset.py
@@ -57,6 +57,12 @@ def test_union_and_intersection():
     assert list(a & b) == [Interval(3, 4), Interval(6, 7)]
 
 
+def test_intersection_of_back_to_back_slots_is_empty():
+    morning = IntervalSet([Interval(9, 12)])
+    afternoon = IntervalSet([Interval(12, 17)])
+    assert not (morning & afternoon)
+
+
 def test_complement_at_the_edges():
     s = IntervalSet([Interval(0, 2), Interval(8, 10)])
     assert list(s.complement(Interval(0, 10))) == [Interval(2, 8)]
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_interval.py tests/test_intervalset.py
: '>>>>> End Test Output'
git checkout 0922a3a8a908fe086d89893e2f558a7af60dbcff -- tests/test_interval.py tests/test_intervalset.py
