import io
import subprocess
import sys

import pytest

from semverkit.cli import main


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_sort():
    code, out, _ = run("sort", "1.10.0", "1.2.0", "1.9.0-rc.1", "1.9.0")
    assert code == 0
    assert out.split() == ["1.2.0", "1.9.0-rc.1", "1.9.0", "1.10.0"]
    _, out, _ = run("sort", "-r", "1.0.0", "2.0.0")
    assert out.split() == ["2.0.0", "1.0.0"]


def test_bump():
    assert run("bump", "minor", "1.2.3")[1] == "1.3.0\n"
    assert run("bump", "prerelease", "1.2.3", "--token", "beta")[1] == "1.2.4-beta.1\n"


def test_satisfies():
    code, out, _ = run("satisfies", "^1", "0.9.0", "1.5.0", "2.0.0")
    assert (code, out) == (0, "1.5.0\n")
    assert run("satisfies", "^3", "1.0.0")[0] == 1


def test_max():
    assert run("max", "~1.2", "1.2.0", "1.2.7", "1.3.0") == (0, "1.2.7\n", "")
    assert run("max", "^9", "1.0.0")[0] == 1


def test_invalid_input_is_reported():
    code, out, err = run("sort", "1.0.0", "banana")
    assert code == 2
    assert out == ""
    assert "banana" in err


def test_python_m_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "semverkit", "sort", "2.0.0", "1.0.0"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0
    assert proc.stdout.split() == ["1.0.0", "2.0.0"]


def test_unknown_command_exits():
    with pytest.raises(SystemExit):
        run("frobnicate")
