#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff b0f9063f9b20e87232a2d7354b72227329ba5ee8
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_cli.py tests/test_version.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_cli.py b/tests/test_cli.py
index 0b82a94e5389..fd06483a79cc 100644
--- a/tests/test_cli.py
+++ b/tests/test_cli.py
@@ -26,6 +26,18 @@ def test_bump():
     assert run("bump", "prerelease", "1.2.3", "--token", "beta")[1] == "1.2.4-beta.1\n"
 
 
+def test_diff():
+    assert run("diff", "1.4.2", "1.5.0") == (0, "minor\n", "")
+    assert run("diff", "2.0.0", "2.0.0-rc.3") == (0, "prerelease\n", "")
+    assert run("diff", "1.0.0", "1.0.0+build.5") == (0, "none\n", "")
+
+
+def test_diff_invalid_version():
+    code, out, err = run("diff", "1.0", "1.0.0")
+    assert (code, out) == (2, "")
+    assert "1.0" in err
+
+
 def test_satisfies():
     code, out, _ = run("satisfies", "^1", "0.9.0", "1.5.0", "2.0.0")
     assert (code, out) == (0, "1.5.0\n")
diff --git a/tests/test_version.py b/tests/test_version.py
index 53f099645c2e..044fc33eaaaf 100644
--- a/tests/test_version.py
+++ b/tests/test_version.py
@@ -1,5 +1,6 @@
 import pytest
 
+import semverkit
 from semverkit import InvalidVersion, Version
 
 
@@ -90,3 +91,30 @@ def test_bump_unknown_part():
 
 def test_release_drops_prerelease_and_build():
     assert Version.parse("1.2.3-rc.1+b5").release == Version(1, 2, 3)
+
+
+def test_diff_parts():
+    assert semverkit.diff("1.2.3", "2.0.0") == "major"
+    assert semverkit.diff("1.2.3", "1.3.0") == "minor"
+    assert semverkit.diff("1.2.3", "1.2.4") == "patch"
+    assert semverkit.diff("0.0.1", "0.0.2") == "patch"
+
+
+def test_diff_prereleases():
+    assert semverkit.diff("2.0.0-rc.1", "2.0.0") == "prerelease"
+    assert semverkit.diff("2.0.0-rc.1", "2.0.0-rc.2") == "prerelease"
+    assert semverkit.diff("1.9.0", "2.0.0-rc.1") == "major"
+
+
+def test_diff_is_symmetric_and_accepts_versions():
+    assert semverkit.diff(Version(1, 2, 3), "1.4.0") == semverkit.diff("1.4.0", Version(1, 2, 3)) == "minor"
+
+
+def test_diff_of_equal_versions_is_none():
+    assert semverkit.diff("1.2.3", "1.2.3") is None
+    assert semverkit.diff("1.2.3+build.1", "1.2.3+build.2") is None
+
+
+def test_diff_rejects_invalid_versions():
+    with pytest.raises(InvalidVersion):
+        semverkit.diff("1.2", "1.2.3")
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_cli.py tests/test_version.py
: '>>>>> End Test Output'
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_cli.py tests/test_version.py
