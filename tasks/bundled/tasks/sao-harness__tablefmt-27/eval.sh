#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff e92943bb6d936418619d131eab592012c477aaea
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_table.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_table.py b/tests/test_table.py
index 89b8cd4acdcc..03c3cca11277 100644
--- a/tests/test_table.py
+++ b/tests/test_table.py
@@ -86,3 +86,53 @@ def test_add_row_and_ncols():
     t.add_row([1, 2, 3])
     assert t.ncols == 3
     assert t.column(2) == [3]
+
+
+RECORDS = [
+    {"host": "web-1", "load": 0.5},
+    {"host": "db-1", "load": 1.25, "role": "primary"},
+    {"role": "replica", "host": "db-2"},
+]
+
+
+def test_from_records_uses_keys_in_order_of_appearance():
+    t = Table.from_records(RECORDS, missing="n/a", align="left")
+    assert t.headers == ["host", "load", "role"]
+    assert t.render("plain").splitlines() == [
+        "host   load  role",
+        "web-1  0.5   n/a",
+        "db-1   1.25  primary",
+        "db-2   n/a   replica",
+    ]
+
+
+def test_from_records_with_explicit_columns():
+    t = Table.from_records(RECORDS, columns=["role", "host"])
+    assert t.rows == [[None, "web-1"], ["primary", "db-1"], ["replica", "db-2"]]
+
+
+def test_from_records_passes_options():
+    t = Table.from_records(({"x": v} for v in (1.0, 2.25)), floatfmt=".1f")
+    assert t.render("pipe") == "|   x |\n|----:|\n| 1.0 |\n| 2.2 |"
+
+
+def test_from_records_rejects_sequences():
+    with pytest.raises(TypeError, match="record 1"):
+        Table.from_records([{"a": 1}, ["b"]])
+
+
+def test_tabulate_records_with_keys():
+    out = tabulate([{"host": "web-1", "up": True}, {"host": "db-1"}], headers="keys")
+    assert out.splitlines() == ["host   up", "-----  ----", "web-1  True", "db-1"]
+    assert tabulate(RECORDS[:1]) == tabulate(RECORDS[:1], headers="keys")
+
+
+def test_tabulate_records_with_header_list():
+    out = tabulate(RECORDS, ["host", "role"], style="plain")
+    assert out.splitlines()[0] == "host   role"
+    assert out.splitlines()[3] == "db-2   replica"
+
+
+def test_tabulate_keys_needs_records():
+    with pytest.raises(ValueError, match="keys"):
+        tabulate([["a", 1]], headers="keys")
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_table.py
: '>>>>> End Test Output'
git checkout e92943bb6d936418619d131eab592012c477aaea -- tests/test_table.py
