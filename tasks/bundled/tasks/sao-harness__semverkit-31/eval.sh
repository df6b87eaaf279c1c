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
index 0b82a94e5389..da35cd9ea23d 100644
--- a/tests/test_cli.py
+++ b/tests/test_cli.py
@@ -21,6 +21,11 @@ def test_sort():
     assert out.split() == ["2.0.0", "1.0.0"]
 
 
+def test_sort_release_candidates():
+    _, out, _ = run("sort", "2.0.0-rc.10", "2.0.0-rc.2", "2.0.0-rc.1")
+    assert out.split() == ["2.0.0-rc.1", "2.0.0-rc.2", "2.0.0-rc.10"]
+
+
 def test_bump():
     assert run("bump", "minor", "1.2.3")[1] == "1.3.0\n"
     assert run("bump", "prerelease", "1.2.3", "--token", "beta")[1] == "1.2.4-beta.1\n"
diff --git a/tests/test_version.py b/tests/test_version.py
index 53f099645c2e..1155e6d5ac4d 100644
--- a/tests/test_version.py
+++ b/tests/test_version.py
@@ -60,6 +60,34 @@ def test_prerelease_alphabetical_ordering():
     assert Version.parse("1.0.0-beta") < Version.parse("1.0.0-rc")
 
 
+def test_numeric_prerelease_identifiers_compare_as_numbers():
+    assert Version.parse("1.0.0-alpha.2") < Version.parse("1.0.0-alpha.10")
+    assert Version.parse("1.0.0-rc.9") < Version.parse("1.0.0-rc.11")
+    assert Version.parse("1.0.0-2") < Version.parse("1.0.0-10")
+
+
+def test_numeric_identifiers_rank_below_alphanumeric():
+    assert Version.parse("1.0.0-alpha.1") < Version.parse("1.0.0-alpha.beta")
+    assert Version.parse("1.0.0-999") < Version.parse("1.0.0-a")
+
+
+def test_semver_spec_precedence_example():
+    chain = [
+        "1.0.0-alpha",
+        "1.0.0-alpha.1",
+        "1.0.0-alpha.beta",
+        "1.0.0-beta",
+        "1.0.0-beta.2",
+        "1.0.0-beta.11",
+        "1.0.0-rc.1",
+        "1.0.0",
+    ]
+    versions = [Version.parse(t) for t in chain]
+    assert sorted(reversed(versions)) == versions
+    for low, high in zip(versions, versions[1:]):
+        assert low < high and low.compare(high) == -1
+
+
 def test_compare():
     assert Version.parse("1.2.3").compare(Version.parse("1.2.4")) == -1
     assert Version.parse("1.2.4").compare(Version.parse("1.2.3")) == 1
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_cli.py tests/test_version.py
: '>>>>> End Test Output'
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_cli.py tests/test_version.py
