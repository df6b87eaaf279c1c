import minicfg


def roundtrip(cfg):
    return minicfg.loads(minicfg.dumps(cfg), interpolation=False).to_dict()


def test_dumps_layout():
    cfg = minicfg.loads("[b]\nx = 1\n[DEFAULT]\nd = 0\n[a]\ny = two\n")
    assert minicfg.dumps(cfg) == "[DEFAULT]\nd = 0\n\n[b]\nx = 1\n\n[a]\ny = two\n"


def test_roundtrip_simple_values():
    cfg = minicfg.loads("[a]\nx = 1\ny = hello world\nempty =\n")
    assert roundtrip(cfg) == cfg.to_dict(raw=True)


def test_surrounding_whitespace_is_quoted():
    cfg = minicfg.Config()
    cfg.add_section("a")["pad"] = "  padded  "
    assert minicfg.dumps(cfg) == '[a]\npad = "  padded  "\n'
    assert roundtrip(cfg) == {"a": {"pad": "  padded  "}}


def test_multiline_values_use_continuation_lines():
    cfg = minicfg.Config()
    cfg.add_section("a")["text"] = "one\ntwo\nthree"
    assert minicfg.dumps(cfg) == "[a]\ntext = one\n    two\n    three\n"
    assert roundtrip(cfg) == {"a": {"text": "one\ntwo\nthree"}}


def test_dump_expanded_values():
    cfg = minicfg.loads("[a]\nroot = /srv\nlogs = ${root}/logs\n")
    assert "logs = ${root}/logs" in minicfg.dumps(cfg)
    assert "logs = /srv/logs" in minicfg.dumps(cfg, raw=False)

