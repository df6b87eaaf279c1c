#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff e92943bb6d936418619d131eab592012c477aaea
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_table.py tests/test_width.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_table.py b/tests/test_table.py
index 89b8cd4acdcc..462bb200de88 100644
--- a/tests/test_table.py
+++ b/tests/test_table.py
@@ -76,6 +76,20 @@ def test_multiline_cells():
     assert out.splitlines() == ["a  x", "b"]
 
 
+def test_coloured_cells_keep_columns_aligned():
+    red = "\x1b[1;31mFAIL\x1b[0m"
+    out = tabulate([[red, 3], ["ok", 12]], ["status", "n"], style="grid")
+    assert out.splitlines() == [
+        "+--------+----+",
+        "| status |  n |",
+        "+========+====+",
+        f"| {red}   |  3 |",
+        "+--------+----+",
+        "| ok     | 12 |",
+        "+--------+----+",
+    ]
+
+
 def test_str_uses_simple_style():
     t = Table([["a", 1]], ["k", "v"])
     assert str(t) == t.render("simple")
diff --git a/tests/test_width.py b/tests/test_width.py
index 7267665848c2..6d20e0593d2a 100644
--- a/tests/test_width.py
+++ b/tests/test_width.py
@@ -21,6 +21,16 @@ def test_strip_simple_colours():
     assert display_width("\x1b[1mbold\x1b[0m") == 4
 
 
+def test_strip_combined_and_256_colour_sequences():
+    assert strip_ansi("\x1b[1;31mFAIL\x1b[0m") == "FAIL"
+    assert strip_ansi("\x1b[38;5;208morange\x1b[39;49m") == "orange"
+    assert display_width("\x1b[1;4;32mok\x1b[0m") == 2
+
+
+def test_pad_coloured_text():
+    assert pad("\x1b[1;31mab\x1b[0m", 4, "right") == "  \x1b[1;31mab\x1b[0m"
+
+
 @pytest.mark.parametrize(
     "align, expected",
     [("left", "ab   "), ("right", "   ab"), ("center", " ab  ")],
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_table.py tests/test_width.py
: '>>>>> End Test Output'
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_table.py tests/test_width.py
