#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff e92943bb6d936418619d131eab592012c477aaea
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_styles.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_styles.py b/tests/test_styles.py
index b13566310247..1ad8f6e9c14c 100644
--- a/tests/test_styles.py
+++ b/tests/test_styles.py
@@ -15,6 +15,17 @@ def test_pipe_style_marks_left_and_right():
     assert out == "| name | n |\n|:-----|--:|\n| a    | 1 |"
 
 
+def test_pipe_style_marks_centred_columns():
+    out = tabulate([["a", 1]], ["name", "n"], style="pipe", align=["center", "center"])
+    assert out.splitlines()[1] == "|:----:|:-:|"
+
+
+def test_rule_cells_with_markers():
+    rule = Rule("|", "-", "|", "|")
+    cells = rule_cells(rule, [5, 5, 5], ["left", "center", "right"], markers=True)
+    assert cells == [":----", ":---:", "----:"]
+
+
 def test_rule_cells_without_markers():
     rule = Rule("+", "-", "+", "+")
     assert rule_cells(rule, [3, 2], ["left", "right"], markers=False) == ["---", "--"]
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_styles.py
: '>>>>> End Test Output'
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_styles.py
