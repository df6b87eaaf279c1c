#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff e92943bb6d936418619d131eab592012c477aaea
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_cells.py tests/test_styles.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_cells.py b/tests/test_cells.py
index e0323526bd08..d64a01afaddf 100644
--- a/tests/test_cells.py
+++ b/tests/test_cells.py
@@ -40,3 +40,11 @@ def test_align_decimal_on_points():
 
 def test_align_decimal_keeps_missing_cells_empty():
     assert align_decimal(["1.5", "", "22.75"]) == [" 1.5 ", "", "22.75"]
+
+
+def test_align_decimal_with_integral_values():
+    assert align_decimal(["1.5", "10", "100.25"]) == ["  1.5 ", " 10   ", "100.25"]
+
+
+def test_align_decimal_with_exponents():
+    assert align_decimal(["1e-05", "2.5", "12.5e+10"]) == [" 1e-05  ", " 2.5    ", "12.5e+10"]
diff --git a/tests/test_styles.py b/tests/test_styles.py
index b13566310247..3d132ced68f4 100644
--- a/tests/test_styles.py
+++ b/tests/test_styles.py
@@ -25,6 +25,17 @@ def test_float_column_decimal_alignment():
     assert out.splitlines() == ["    v", " 1.5", "10.25"]
 
 
+def test_float_column_with_whole_numbers():
+    out = tabulate([[1.5], [10.0], [-1.0]], ["v"], style="plain")
+    assert out.splitlines() == ["   v", " 1.5", "10", "-1"]
+
+
+def test_float_column_alignment_in_grid():
+    out = tabulate([["a", 2.0], ["b", 0.125]], ["k", "x"], style="grid")
+    assert out.splitlines()[3] == "| a | 2     |"
+    assert out.splitlines()[5] == "| b | 0.125 |"
+
+
 def test_every_style_renders():
     for name in sorted(STYLES):
         out = tabulate([["a", 1], ["b", 2]], ["x", "y"], style=name)
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_cells.py tests/test_styles.py
: '>>>>> End Test Output'
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_cells.py tests/test_styles.py
