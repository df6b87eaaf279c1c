#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff 29069a01ac3d260fa06766f916f7063b664ae567
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_writer.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_writer.py b/tests/test_writer.py
index f8e075f3a620..220cef27332e 100644
--- a/tests/test_writer.py
+++ b/tests/test_writer.py
@@ -34,3 +34,41 @@ def test_dump_expanded_values():
     assert "logs = ${root}/logs" in minicfg.dumps(cfg)
     assert "logs = /srv/logs" in minicfg.dumps(cfg, raw=False)
 
+
+
+def test_inline_comment_characters_are_quoted():
+    cfg = minicfg.Config()
+    section = cfg.add_section("a")
+    section["sql"] = "select 1 ; drop"
+    section["tag"] = "v1 #latest"
+    section["url"] = "http://host/#anchor"
+    assert roundtrip(cfg) == {
+        "a": {"sql": "select 1 ; drop", "tag": "v1 #latest", "url": "http://host/#anchor"}
+    }
+    assert "url = http://host/#anchor\n" in minicfg.dumps(cfg)
+
+
+def test_values_starting_with_quotes_roundtrip():
+    cfg = minicfg.Config()
+    section = cfg.add_section("a")
+    section["double"] = '"quoted" word'
+    section["single"] = "'single'"
+    assert roundtrip(cfg) == {"a": {"double": '"quoted" word', "single": "'single'"}}
+
+
+def test_quoted_values_escape_backslashes_and_quotes():
+    cfg = minicfg.Config()
+    cfg.add_section("a")["path"] = ' C:\\new\\table "x" '
+    assert minicfg.dumps(cfg) == '[a]\npath = " C:\\\\new\\\\table \\"x\\" "\n'
+    assert roundtrip(cfg) == {"a": {"path": ' C:\\new\\table "x" '}}
+
+
+def test_multiline_values_that_cannot_use_continuation_lines():
+    cfg = minicfg.Config()
+    section = cfg.add_section("a")
+    section["gap"] = "one\n\ntwo"
+    section["comment"] = "one\n# two"
+    section["indent"] = "one\n  two"
+    assert roundtrip(cfg) == {
+        "a": {"gap": "one\n\ntwo", "comment": "one\n# two", "indent": "one\n  two"}
+    }
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_writer.py
: '>>>>> End Test Output'
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_writer.py
