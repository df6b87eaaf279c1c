import pytest

import minicfg
from minicfg import InterpolationError
from minicfg.interpolation import references


def test_same_section_reference():
    cfg = minicfg.loads("[a]\nroot = /srv\nlogs = ${root}/logs\n")
    assert cfg.get("a", "logs") == "/srv/logs"


def test_reference_to_default():
    cfg = minicfg.loads("[DEFAULT]\nroot = /srv\n[a]\nlogs = ${root}/logs\n")
    assert cfg.get("a", "logs") == "/srv/logs"


def test_cross_section_reference():
    cfg = minicfg.loads("[paths]\nroot = /srv\n[app]\ndata = ${paths:root}/data\n")
    assert cfg.get("app", "data") == "/srv/data"


def test_nested_references():
    cfg = minicfg.loads("[a]\nx = 1\ny = ${x}${x}\nz = ${y}-${y}\n")
    assert cfg.get("a", "z") == "11-11"


def test_dollar_escape():
    cfg = minicfg.loads("[a]\nprice = $$5 ${currency}\ncurrency = USD\n")
    assert cfg.get("a", "price") == "$5 USD"


def test_missing_reference():
    cfg = minicfg.loads("[a]\nx = ${nope}\n")
    with pytest.raises(InterpolationError, match="nope"):
        cfg.get("a", "x")


def test_interpolation_can_be_disabled():
    cfg = minicfg.loads("[a]\nx = ${y}\n", interpolation=False)
    assert cfg.get("a", "x") == "${y}"


def test_late_binding():
    cfg = minicfg.loads("[a]\nroot = /srv\nlogs = ${root}/logs\n")
    cfg.set("a", "root", "/opt")
    assert cfg.get("a", "logs") == "/opt/logs"


def test_references_lists_targets():
    assert references("${a} and ${s:B} and $$ and ${ bad ref }") == [
        (None, "a"),
        ("s", "b"),
    ]
