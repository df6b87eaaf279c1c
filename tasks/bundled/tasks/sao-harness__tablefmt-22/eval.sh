#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff e92943bb6d936418619d131eab592012c477aaea
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_table.py tests/test_wrap.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_table.py b/tests/test_table.py
index 89b8cd4acdcc..e24044415221 100644
--- a/tests/test_table.py
+++ b/tests/test_table.py
@@ -71,6 +71,20 @@ def test_maxcolwidths_wraps_cells():
     ]
 
 
+def test_maxcolwidths_with_wide_characters():
+    text = "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059"
+    out = tabulate([[text, 1]], ["t", "n"], style="grid", maxcolwidths=[8, None])
+    assert out.splitlines() == [
+        "+----------+---+",
+        "| t        | n |",
+        "+==========+===+",
+        "| \u6771\u4eac\u306f\u65e5 | 1 |",
+        "| \u672c\u306e\u9996\u90fd |   |",
+        "| \u3067\u3059     |   |",
+        "+----------+---+",
+    ]
+
+
 def test_multiline_cells():
     out = tabulate([["a\nb", "x"]], style="plain")
     assert out.splitlines() == ["a  x", "b"]
diff --git a/tests/test_wrap.py b/tests/test_wrap.py
index 51214e748aa0..8c5064693831 100644
--- a/tests/test_wrap.py
+++ b/tests/test_wrap.py
@@ -11,6 +11,31 @@ def test_wrap_breaks_long_words():
     assert wrap_text("abcdefghij", 4) == ["abcd", "efgh", "ij"]
 
 
+def test_wrap_counts_wide_characters_twice():
+    assert wrap_text("\u65e5\u672c \u8a9e", 4) == ["\u65e5\u672c", "\u8a9e"]
+    assert wrap_text("abc \u65e5\u672c\u8a9e", 7) == ["abc", "\u65e5\u672c\u8a9e"]
+
+
+def test_wrap_breaks_wide_words_by_columns():
+    text = "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059"
+    assert wrap_text(text, 8) == [
+        "\u6771\u4eac\u306f\u65e5",
+        "\u672c\u306e\u9996\u90fd",
+        "\u3067\u3059",
+    ]
+    assert wrap_text(text, 5) == [
+        "\u6771\u4eac",
+        "\u306f\u65e5",
+        "\u672c\u306e",
+        "\u9996\u90fd",
+        "\u3067\u3059",
+    ]
+
+
+def test_wide_character_wider_than_the_column():
+    assert wrap_text("\u65e5x", 1) == ["\u65e5", "x"]
+
+
 def test_wrap_collapses_whitespace():
     assert wrap_text("a   b\tc", 80) == ["a b c"]
 
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_table.py tests/test_wrap.py
: '>>>>> End Test Output'
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_table.py tests/test_wrap.py
