"""The package as a user installs it: a wheel in a fresh venv, with no checkout in sight.

The wheel is built from this checkout (``pip wheel --no-deps --no-build-isolation``: setuptools from the
project's venv, nothing downloaded) and installed with ``--no-deps`` into a new venv whose only other
path is the project venv's site-packages (a plain path line in a .pth: its packages, not its editable
finder, which would map ``sao_harness`` back to the checkout). From an empty directory: ``sao --help``,
``sao config`` and ``sao tasks list`` (the bundled tasks, package data) must work, every module must come
from the wheel, and ``tasks/suite`` must not be in it; the checkout's links (``sao_harness/core -> ../core``)
become plain files in it.
"""
from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run(argv, cwd, timeout=300):
    out = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})
    assert out.returncode == 0, f"{argv}: {out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv's bin dir, an empty working directory, the wheel)."""
    tmp = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist", ROOT],
        cwd=tmp)
    (wheel,) = (tmp / "dist").glob("sao_harness-*.whl")
    run([sys.executable, "-m", "venv", "--without-pip", tmp / "venv"], cwd=tmp)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([tmp / "venv" / "bin" / "python", "-c", purelib], text=True).strip())
    (site / "project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # a path, not addsitedir
    run([sys.executable, "-m", "pip", "--python", tmp / "venv" / "bin" / "python", "install", "--no-deps", "-q",
         wheel], cwd=tmp)
    work = tmp / "work"
    work.mkdir()
    return tmp / "venv" / "bin", work, wheel


def test_the_wheel_holds_the_namespace_and_the_bundled_tasks_not_the_suite(installed):
    infos = zipfile.ZipFile(installed[2]).infolist()
    names = [i.filename for i in infos]
    assert not [n for i, n in zip(infos, names) if (i.external_attr >> 16) & 0o170000 == 0o120000]  # files, no links
    assert "sao_harness/trainer/algo/gae.py" in names and "sao_harness/harness/engines/registry.py" in names
    assert any(n.startswith("sao_harness/tasks/bundled/tasks/") and n.endswith("/task.yaml") for n in names)
    assert not [n for n in names if n.startswith(("sao_harness/tasks/suite", "core/", "trainer/", "tests/"))]


def test_sao_runs_from_the_wheel_with_no_checkout(installed):
    bin_dir, work, _ = installed
    assert "sao-harness" in run([bin_dir / "sao", "--help"], work)
    config = run([bin_dir / "sao", "config"], work)
    assert "trainer:" in config and "runtime:" in config, config[:2000]
    listed = run([bin_dir / "sao", "tasks", "list"], work)
    assert "sao-harness__minicfg-11" in listed, listed[-2000:]
    where = run([bin_dir / "python", "-c", "import sao_harness.trainer.run.loop as m, "
                 "sao_harness.tasks.formats.loaders as t; print(m.__file__); print(t.BUNDLED)"], work).split()
    assert all(str(ROOT) not in w and "site-packages/sao_harness/" in w for w in where), where
