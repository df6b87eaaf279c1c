#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff b0f9063f9b20e87232a2d7354b72227329ba5ee8
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_version.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_version.py b/tests/test_version.py
index 53f099645c2e..24c6fca1fe6e 100644
--- a/tests/test_version.py
+++ b/tests/test_version.py
@@ -66,6 +66,28 @@ def test_compare():
     assert Version.parse("1.2.3+a").compare(Version.parse("1.2.3+b")) == 0
 
 
+def test_build_metadata_is_ignored_by_equality():
+    a, b = Version.parse("1.0.0+build.1"), Version.parse("1.0.0+build.2")
+    assert a == b
+    assert a <= b and a >= b
+    assert not a < b and not a > b
+    assert a == Version(1, 0, 0)
+
+
+def test_build_metadata_is_ignored_by_hash():
+    versions = {Version.parse("1.0.0+linux"), Version.parse("1.0.0+darwin"), Version(1, 0, 0)}
+    assert len(versions) == 1
+    assert Version.parse("2.1.0+sha.abc") in {Version.parse("2.1.0")}
+
+
+def test_build_metadata_is_kept_in_text():
+    v = Version.parse("1.0.0+build.1")
+    assert v.build == ("build", "1")
+    assert str(v) == "1.0.0+build.1"
+    assert v != Version.parse("1.0.1+build.1")
+    assert v != "1.0.0+build.1"
+
+
 @pytest.mark.parametrize(
     "start, part, expected",
     [
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_version.py
: '>>>>> End Test Output'
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_version.py
