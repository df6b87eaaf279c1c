#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff 29069a01ac3d260fa06766f916f7063b664ae567
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_config.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_config.py b/tests/test_config.py
index 0a3e571a702f..8ea0680c8bbf 100644
--- a/tests/test_config.py
+++ b/tests/test_config.py
@@ -67,6 +67,17 @@ def test_getlist_splits_commas_and_lines(cfg):
     assert cfg.getlist("client", "hosts") == ["alpha", "beta", "gamma"]
 
 
+def test_getlist_ignores_trailing_commas():
+    cfg = minicfg.loads("[a]\nhosts = alpha, beta,\n    gamma,\n")
+    assert cfg.getlist("a", "hosts") == ["alpha", "beta", "gamma"]
+
+
+def test_getlist_of_empty_value_is_empty():
+    cfg = minicfg.loads("[a]\nhosts =\nother = ,\n")
+    assert cfg.getlist("a", "hosts") == []
+    assert cfg["a"].getlist("other") == []
+
+
 def test_set_converts_values(cfg):
     cfg.set("server", "port", 9000)
     cfg["server"]["tls"] = True
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_config.py
: '>>>>> End Test Output'
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_config.py
