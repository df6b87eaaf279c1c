#!/bin/bash
set -uxo pipefail
cd /testbed
git config --global --add safe.directory /testbed
git status
git show
git -c core.fileMode=false diff 29069a01ac3d260fa06766f916f7063b664ae567
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_config.py
rm -f tests/test_env.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_config.py b/tests/test_config.py
index 0a3e571a702f..35336193f6de 100644
--- a/tests/test_config.py
+++ b/tests/test_config.py
@@ -67,6 +67,13 @@ def test_getlist_splits_commas_and_lines(cfg):
     assert cfg.getlist("client", "hosts") == ["alpha", "beta", "gamma"]
 
 
+def test_env_overrides_through_typed_getters(cfg):
+    assert minicfg.ENV_PREFIX == "MINICFG_"
+    cfg.apply_env({"MINICFG_CLIENT__HOSTS": "x\ny", "MINICFG_SERVER__DEBUG": "off"})
+    assert cfg.getlist("client", "hosts") == ["x", "y"]
+    assert cfg["server"].getbool("debug") is False
+
+
 def test_set_converts_values(cfg):
     cfg.set("server", "port", 9000)
     cfg["server"]["tls"] = True
diff --git a/tests/test_env.py b/tests/test_env.py
new file mode 100644
index 000000000000..c523c4eba945
--- /dev/null
+++ b/tests/test_env.py
@@ -0,0 +1,70 @@
+import minicfg
+
+TEXT = """
+[DEFAULT]
+timeout = 30
+
+[Server]
+host = example.org
+port = 8080
+
+[http-server]
+max-conn = 10
+"""
+
+
+def test_env_overrides_existing_value():
+    cfg = minicfg.loads(TEXT)
+    applied = cfg.apply_env({"MINICFG_SERVER__PORT": "9000", "PATH": "/usr/bin"})
+    assert applied == 1
+    assert cfg.getint("Server", "port") == 9000
+    assert cfg.sections() == ["Server", "http-server"]
+
+
+def test_env_normalises_dashes_and_dots():
+    cfg = minicfg.loads(TEXT + "[db.replica]\nread.only = no\n")
+    cfg.apply_env({"MINICFG_HTTP_SERVER__MAX_CONN": "99", "MINICFG_DB_REPLICA__READ_ONLY": "yes"})
+    assert cfg.getint("http-server", "max-conn") == 99
+    assert cfg.getbool("db.replica", "read.only") is True
+    assert "max_conn" not in cfg["http-server"]
+
+
+def test_env_creates_missing_sections_and_keys():
+    cfg = minicfg.loads(TEXT)
+    assert cfg.apply_env({"MINICFG_CACHE__TTL": "60", "MINICFG_SERVER__WORKERS": "4"}) == 2
+    assert cfg.sections() == ["Server", "http-server", "cache"]
+    assert cfg.getint("cache", "ttl") == 60
+    assert cfg.getint("Server", "workers") == 4
+
+
+def test_env_default_section():
+    cfg = minicfg.loads(TEXT)
+    cfg.apply_env({"MINICFG_DEFAULT__TIMEOUT": "5"})
+    assert cfg.getint("http-server", "timeout") == 5
+
+
+def test_env_custom_prefix_and_malformed_names():
+    cfg = minicfg.loads(TEXT)
+    environ = {
+        "APP_SERVER__HOST": "localhost",
+        "APP_NOSEPARATOR": "x",
+        "APP___KEY": "x",
+        "APP_SERVER__": "x",
+        "MINICFG_SERVER__HOST": "ignored",
+    }
+    assert cfg.apply_env(environ, prefix="APP_") == 1
+    assert cfg.get("Server", "host") == "localhost"
+    assert cfg.sections() == ["Server", "http-server"]
+
+
+def test_env_defaults_to_os_environ(monkeypatch):
+    monkeypatch.setenv("MINICFG_SERVER__HOST", "from-env")
+    cfg = minicfg.loads(TEXT)
+    assert cfg.apply_env() >= 1
+    assert cfg["Server"]["host"] == "from-env"
+
+
+def test_env_values_are_interpolated():
+    cfg = minicfg.loads(TEXT)
+    cfg.apply_env({"MINICFG_SERVER__URL": "http://${host}:${port}/"})
+    assert cfg.get("Server", "url") == "http://example.org:8080/"
EOF_114329324912
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_config.py tests/test_env.py
: '>>>>> End Test Output'
git checkout 29069a01ac3d260fa06766f916f7063b664ae567 -- tests/test_config.py
rm -f tests/test_env.py
