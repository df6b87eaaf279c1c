#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff b0f9063f9b20e87232a2d7354b72227329ba5ee8
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_cli.py tests/test_spec.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_cli.py b/tests/test_cli.py
index 0b82a94e5389..01eb1e077ce0 100644
--- a/tests/test_cli.py
+++ b/tests/test_cli.py
@@ -37,6 +37,10 @@ def test_max():
     assert run("max", "^9", "1.0.0")[0] == 1
 
 
+def test_max_with_zero_major_caret():
+    assert run("max", "^0.2", "0.2.1", "0.2.5", "0.3.0") == (0, "0.2.5\n", "")
+
+
 def test_invalid_input_is_reported():
     code, out, err = run("sort", "1.0.0", "banana")
     assert code == 2
diff --git a/tests/test_spec.py b/tests/test_spec.py
index 9603eb36505d..38b6b12b70c5 100644
--- a/tests/test_spec.py
+++ b/tests/test_spec.py
@@ -22,6 +22,26 @@ def test_caret_ranges():
     assert matching("^2", VERSIONS) == ["2.0.0", "2.5.1"]
 
 
+ZERO = ["0.0.1", "0.0.3", "0.0.4", "0.1.0", "0.1.7", "0.2.3", "0.2.9", "0.3.0", "1.0.0"]
+
+
+def test_caret_ranges_below_one():
+    assert matching("^0.2.3", ZERO) == ["0.2.3", "0.2.9"]
+    assert matching("^0.1", ZERO) == ["0.1.0", "0.1.7"]
+    assert str(Range("^0.2.3")) == ">=0.2.3 <0.3.0"
+
+
+def test_caret_ranges_below_zero_point_one():
+    assert matching("^0.0.3", ZERO) == ["0.0.3"]
+    assert matching("^0.0", ZERO) == ["0.0.1", "0.0.3", "0.0.4"]
+    assert str(Range("^0.0.3")) == ">=0.0.3 <0.0.4"
+
+
+def test_caret_zero_major_wildcard():
+    assert matching("^0", ZERO) == ZERO[:-1]
+    assert matching("^0.x", ZERO) == ZERO[:-1]
+
+
 def test_tilde_ranges():
     assert matching("~1.2.3", VERSIONS) == ["1.2.3", "1.2.9"]
     assert matching("~1", VERSIONS) == ["1.0.0", "1.2.3", "1.2.9", "1.3.0", "1.9.9"]
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_cli.py tests/test_spec.py
: '>>>>> End Test Output'
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_cli.py tests/test_spec.py
