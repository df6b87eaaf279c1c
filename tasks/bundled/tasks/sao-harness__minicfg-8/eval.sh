#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff 29069a01ac3d260fa06766f916f7063b664ae567
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_parser.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_parser.py b/tests/test_parser.py
index cc346408c141..7f3d4322b4ff 100644
--- a/tests/test_parser.py
+++ b/tests/test_parser.py
@@ -38,6 +38,16 @@ def test_double_quotes_understand_escapes():
     assert value == 'tab\there "q" back\\slash'
 
 
+def test_single_quoted_value_keeps_comment_characters():
+    (section,) = parse("[a]\npattern = 'a ;b #c'  # trailing comment\n")
+    assert section.as_dict() == {"pattern": "a ;b #c"}
+
+
+def test_single_quoted_value_with_double_quote_inside():
+    (section,) = parse("""[a]\nmsg = 'say "hi" ; then leave'\n""")
+    assert section.as_dict() == {"msg": 'say "hi" ; then leave'}
+
+
 def test_single_quotes_are_literal():
     value, quoted = parse_value(r"'C:\temp\new'")
     assert quoted is True
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_parser.py
: '>>>>> End Test Output'
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_parser.py
