import pytest

import minicfg
from minicfg import Config, MissingKeyError, MissingSectionError

TEXT = """
[DEFAULT]
timeout = 30
debug = off

[server]
host = example.org
port = 0x1F90
debug = Yes
ratio = 0.75

[client]
hosts = alpha, beta
    gamma
"""


@pytest.fixture
def cfg():
    return minicfg.loads(TEXT)


def test_sections_exclude_default(cfg):
    assert cfg.sections() == ["server", "client"]
    assert "server" in cfg
    assert list(cfg) == ["server", "client"]


def test_get_and_fallback(cfg):
    assert cfg.get("server", "host") == "example.org"
    assert cfg.get("server", "missing", None) is None
    with pytest.raises(MissingKeyError):
        cfg.get("server", "missing")
    with pytest.raises(MissingSectionError):
        cfg.get("nope", "host")


def test_defaults_are_inherited(cfg):
    assert cfg["client"]["timeout"] == "30"
    assert cfg.keys("server") == ["host", "port", "debug", "ratio", "timeout"]


def test_typed_getters(cfg):
    assert cfg.getint("server", "port") == 8080
    assert cfg.getint("client", "timeout") == 30
    assert cfg.getfloat("server", "ratio") == 0.75
    assert cfg.getbool("server", "debug") is True
    assert cfg.getbool("client", "debug") is False


def test_typed_getter_fallback(cfg):
    assert cfg.getint("server", "workers", 4) == 4
    assert cfg["server"].getbool("verbose", fallback=False) is False


def test_typed_getter_error_names_the_key(cfg):
    with pytest.raises(ValueError, match=r"\[server\] host"):
        cfg.getint("server", "host")


def test_getlist_splits_commas_and_lines(cfg):
    assert cfg.getlist("client", "hosts") == ["alpha", "beta", "gamma"]


def test_set_converts_values(cfg):
    cfg.set("server", "port", 9000)
    cfg["server"]["tls"] = True
    assert cfg.get("server", "port") == "9000"
    assert cfg.get("server", "tls") == "true"


def test_add_and_remove_section():
    cfg = Config()
    cfg.add_section("x")["a"] = "1"
    with pytest.raises(ValueError):
        cfg.add_section("x")
    cfg.remove_section("x")
    assert cfg.sections() == []


def test_merge_overrides_values(cfg):
    other = minicfg.loads("[server]\nhost = localhost\n[extra]\nk = v\n")
    cfg.merge(other)
    assert cfg.get("server", "host") == "localhost"
    assert cfg.get("extra", "k") == "v"


def test_load_from_file(tmp_path):
    path = tmp_path / "app.cfg"
    path.write_text("[a]\nx = 1\n", encoding="utf-8")
    assert minicfg.load(path).getint("a", "x") == 1


def test_section_is_a_mapping(cfg):
    section = cfg["server"]
    assert len(section) == 5
    assert dict(section)["host"] == "example.org"
    del section["ratio"]
    assert "ratio" not in section
