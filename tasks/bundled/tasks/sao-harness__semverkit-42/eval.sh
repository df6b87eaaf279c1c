#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff b0f9063f9b20e87232a2d7354b72227329ba5ee8
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_cli.py tests/test_spec.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_cli.py b/tests/test_cli.py
index 0b82a94e5389..0832e8f9cfa7 100644
--- a/tests/test_cli.py
+++ b/tests/test_cli.py
@@ -37,6 +37,17 @@ def test_max():
     assert run("max", "^9", "1.0.0")[0] == 1
 
 
+def test_satisfies_leaves_out_prereleases():
+    assert run("satisfies", ">=1.0.0", "1.0.0", "2.0.0-beta.1") == (0, "1.0.0\n", "")
+    code, out, _ = run("satisfies", "--include-prerelease", ">=1.0.0", "1.0.0", "2.0.0-beta.1")
+    assert (code, out.split()) == (0, ["1.0.0", "2.0.0-beta.1"])
+
+
+def test_max_include_prerelease():
+    assert run("max", "^2", "2.1.0", "2.2.0-rc.1")[1] == "2.1.0\n"
+    assert run("max", "^2", "2.1.0", "2.2.0-rc.1", "--include-prerelease")[1] == "2.2.0-rc.1\n"
+
+
 def test_invalid_input_is_reported():
     code, out, err = run("sort", "1.0.0", "banana")
     assert code == 2
diff --git a/tests/test_spec.py b/tests/test_spec.py
index 9603eb36505d..b26dcd046e35 100644
--- a/tests/test_spec.py
+++ b/tests/test_spec.py
@@ -76,3 +76,34 @@ def test_invalid_ranges():
     for text in (">=banana", "^1.2.3.4", "1.2.3 - "):
         with pytest.raises(InvalidRange):
             Range(text)
+
+
+def test_prereleases_are_excluded_by_default():
+    assert not Range(">=1.0.0").contains("2.0.0-beta.1")
+    assert not Range("^1.2.3").contains("1.5.0-rc.1")
+    assert not Range("*").contains("1.0.0-rc.1")
+    assert matching("^1", ["1.0.0", "1.1.0-rc.1", "1.1.0"]) == ["1.0.0", "1.1.0"]
+
+
+def test_prerelease_matches_a_comparator_of_the_same_release():
+    r = Range(">=1.2.3-alpha.3")
+    assert r.contains("1.2.3-alpha.7")
+    assert not r.contains("3.4.5-alpha.9")
+    assert r.contains("3.4.5")
+    assert Range("1.0.0-rc.1 - 1.0.0").contains("1.0.0-rc.2")
+    assert not Range("<1.0.0-rc.1 || >=2.0.0").contains("2.0.0-rc.1")
+
+
+def test_include_prerelease_option():
+    r = Range(">=1.0.0", include_prerelease=True)
+    assert r.contains("2.0.0-beta.1")
+    assert str(r.max_satisfying(["1.5.0", "2.0.0-beta.1"])) == "2.0.0-beta.1"
+    assert repr(r) == "Range('>=1.0.0', include_prerelease=True)"
+    assert satisfies("2.0.0-beta.1", ">=1", include_prerelease=True)
+    assert not satisfies("2.0.0-beta.1", ">=1")
+
+
+def test_max_satisfying_skips_prereleases():
+    versions = ["2.0.0", "2.1.0", "2.2.0-rc.1"]
+    assert str(Range("^2").max_satisfying(versions)) == "2.1.0"
+    assert str(Range(">=2.2.0-rc.1").max_satisfying(versions)) == "2.2.0-rc.1"
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_cli.py tests/test_spec.py
: '>>>>> End Test Output'
git checkout b0f9063f9b20e87232a2d7354b72227329ba5ee8 -- tests/test_cli.py tests/test_spec.py
