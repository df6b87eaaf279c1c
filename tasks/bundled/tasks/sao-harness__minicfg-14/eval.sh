#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff 29069a01ac3d260fa06766f916f7063b664ae567
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_interpolation.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_interpolation.py b/tests/test_interpolation.py
index 8cc2b522fff4..27888fe50269 100644
--- a/tests/test_interpolation.py
+++ b/tests/test_interpolation.py
@@ -36,6 +36,27 @@ def test_missing_reference():
         cfg.get("a", "x")
 
 
+def test_self_reference_is_an_interpolation_error():
+    cfg = minicfg.loads("[a]\nx = ${x}/more\n")
+    with pytest.raises(InterpolationError, match="cycle"):
+        cfg.get("a", "x")
+
+
+def test_reference_cycle_across_sections():
+    cfg = minicfg.loads("[a]\nx = ${b:y}\n[b]\ny = ${a:x}\n")
+    with pytest.raises(InterpolationError) as info:
+        cfg.get("a", "x")
+    assert "cycle" in str(info.value)
+    with pytest.raises(InterpolationError):
+        cfg.to_dict()
+
+
+def test_deep_but_finite_chain_resolves():
+    lines = ["[a]", "k0 = end"] + [f"k{i} = ${{k{i - 1}}}" for i in range(1, 10)]
+    cfg = minicfg.loads("\n".join(lines) + "\n")
+    assert cfg.get("a", "k9") == "end"
+
+
 def test_interpolation_can_be_disabled():
     cfg = minicfg.loads("[a]\nx = ${y}\n", interpolation=False)
     assert cfg.get("a", "x") == "${y}"
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_interpolation.py
: '>>>>> End Test Output'
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_interpolation.py
