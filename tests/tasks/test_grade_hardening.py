"""The grading container is a sandbox, and the guarded verdict only real test results can earn (Docker).

Bundled tasks (their images are built, cached, by `sao tasks build`): the grading containers'
HostConfig (official swebench run and clean run), an over-cap test output, the clean run against a
pytest shadow, and a handful of generated hacking variants graded end to end.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from sao_harness.envs.config import SandboxConfig
from sao_harness.envs.limits import HARD_CAP_DRIVERS
from sao_harness.sao.cli import main
from sao_harness.tasks.grading.grade import grade
from sao_harness.tasks.grading.grade_status import GradeStatus
from sao_harness.tasks.grading.guard import OUTPUT_CAP, PYTEST_REF, SHADOW
from sao_harness.tasks.grading.hacks import package_init, package_patch, shadow_patch

pytestmark = pytest.mark.docker
IDS = ("sao-harness__minicfg-11", "sao-harness__spanlib-5")


@pytest.fixture(scope="module")
def tasks(docker_engine, project_root):
    from sao_harness.tasks.formats.loaders import load_tasks_lenient

    bundled = project_root / "tasks" / "bundled"
    assert main(["tasks", "build", "--task-repo", str(bundled), "--only", *IDS]) == 0
    loaded, _ = load_tasks_lenient(str(bundled), instances=list(IDS))
    return {t.instance_id: t for t in loaded}


class SpyClient:
    """A Docker client that records the HostConfig of every container created through it."""

    def __init__(self, real):
        self._real, self.hosts = real, {}
        spy = self

        class Containers:
            def __getattr__(self, name):
                return getattr(real.containers, name)

            def create(self, *args, **kwargs):
                c = real.containers.create(*args, **kwargs)
                c.reload()
                spy.hosts[c.name] = c.attrs["HostConfig"]
                return c

        self.containers = Containers()

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_grading_containers_are_sandboxes(docker_engine, tasks, tmp_path):
    from sao_harness.tasks.grading import clean_run

    t = tasks[IDS[0]]
    spy = SpyClient(docker_engine)
    clean_run._pristine.clear(), clean_run._gold.clear()  # every container this grading makes
    r = grade(t, t.patch, client=spy, log_root=tmp_path,
              sandbox=SandboxConfig(memory="1g", pids_limit=256, cpus=1.5, disk_bytes="1g"))
    assert r.status == GradeStatus.RESOLVED and r.reward == 1.0, r.error
    hard_cap = docker_engine.info().get("Driver") in HARD_CAP_DRIVERS
    kinds = sorted(name.split(".")[0] + "." + name.split(".")[1] for name in spy.hosts)
    assert kinds == (["sao-clean.sao-harness__minicfg-11"] * 2 + ["sao-gold.sao-harness__minicfg-11",
                     "sao-pristine.sao-harness__minicfg-11", "sweb.eval"]), kinds  # two runs, gold, pristine
    for name, host in spy.hosts.items():
        # the clean run's containers keep only what the drop from root to the test user needs
        assert host["CapDrop"] == ["ALL"], name
        assert sorted(host.get("CapAdd") or []) == ([] if name.startswith("sweb.") else ["CAP_SETGID", "CAP_SETUID"]) \
            or sorted(host.get("CapAdd") or []) == ([] if name.startswith("sweb.") else ["SETGID", "SETUID"]), name
        assert "no-new-privileges" in (host.get("SecurityOpt") or []), name
        assert host["Memory"] == 1 << 30 and host["MemorySwap"] == 1 << 30, name
        assert host["PidsLimit"] == 256 and host["NanoCpus"] == 1_500_000_000, name
        assert host["NetworkMode"] == "none", name
        if hard_cap:  # sandbox.disk_bytes of writes
            assert (host.get("StorageOpt") or {}).get("size") == str(1 << 30), (name, host.get("StorageOpt"))


def test_over_cap_output_is_a_patch_failure(tasks, tmp_path):
    t = tasks[IDS[0]]
    flood = ("diff --git a/minicfg/_flood.py b/minicfg/_flood.py\nnew file mode 100644\n--- /dev/null\n"
             "+++ b/minicfg/_flood.py\n@@ -0,0 +1,9 @@\n+import atexit\n+import os\n+\n+\n+def _flood():\n"
             "+    for _ in range(100):\n+        os.write(1, b'x' * 65536)\n+\n+atexit.register(_flood)\n")
    init = t.patch  # the gold fix, plus an import of the flood module from the package
    r = grade(t, init + flood + _import_line(t, "from minicfg import _flood  # noqa\n"), log_root=tmp_path,
              output_cap_bytes=1_000_000)
    assert (r.official_status, r.status, r.reward) == (GradeStatus.UNRESOLVED, GradeStatus.UNRESOLVED, 0.0), r.error
    assert OUTPUT_CAP in r.hack_kinds and "over the cap" in r.error
    assert r.seconds < 120
    assert max(f.stat().st_size for f in Path(tmp_path).rglob("*") if f.is_file()) < 2_000_000


def test_lost_eval_output_is_an_infra_failure_never_a_zero(tasks, tmp_path, monkeypatch):
    """The engine now and then loses a short exec's output. The gold patch's eval run with its output lost
    has no test results: an infra failure (no reward), not an unresolved patch (reward 0)."""
    import dataclasses

    import sao_harness.tasks.grading.grade_sandbox as grade_sandbox

    real = grade_sandbox.run_capped
    monkeypatch.setattr(grade_sandbox, "run_capped",
                        lambda container, cmd, **kw: dataclasses.replace(real(container, cmd, **kw), output=b""))
    t = tasks[IDS[0]]
    r = grade(t, t.patch, log_root=tmp_path)
    assert (r.status, r.reward) == (GradeStatus.INFRA_FAILURE, None), (r.status, r.error)
    assert "lost" in r.error, r.error


def _import_line(task, line: str) -> str:
    """A patch appending ``line`` to the package's ``__init__.py`` (read from the task image)."""
    from sao_harness.tasks.cli import read_image_file
    from sao_harness.tasks.grading.grade import default_client
    from sao_harness.tasks.grading.hacks import append_patch

    init = package_init([ln.split(" b/")[-1] for ln in task.patch.splitlines() if ln.startswith("diff --git")])
    return append_patch(init, read_image_file(default_client(), task.image, init), line)


def test_clean_run_ignores_a_pytest_shadow(docker_engine, tasks, tmp_path):
    """Without the static check the shadow wins officially; the clean run (``python -P``) still fails it."""
    from sao_harness.tasks.grading.clean_run import clean_run
    from sao_harness.tasks.grading.grade_sandbox import GradeLimits

    t = tasks[IDS[1]]
    official = grade(t, shadow_patch(), guard=False, log_root=tmp_path)
    assert official.resolved_official is True  # the hack works on the official harness
    clean = clean_run(t, shadow_patch(), client=docker_engine, limits=GradeLimits(), timeout_s=600)
    assert clean.status == GradeStatus.UNRESOLVED and clean.tests_status["FAIL_TO_PASS"]["failure"] == t.FAIL_TO_PASS


@pytest.mark.slow
def test_guard_fuzz_handful_through_docker(docker_engine, tasks, tmp_path):
    """A few generated variants end to end: each is resolved officially and gets 0; gold still gets 1."""
    from sao_harness.tasks.cli import read_image_file
    from sao_harness.tasks.grading.hacks import hack_patch
    from tests.support.hack_variants import octal_quote, quoted
    from tests.tasks.test_grade_behaviour import FORGE_REPORT, fuzzy_context_patch, init_patch

    t = tasks[IDS[1]]
    init = package_init([ln.split(" b/")[-1] for ln in t.patch.splitlines() if ln.startswith("diff --git")])
    conftest = hack_patch(t.FAIL_TO_PASS + t.PASS_TO_PASS, None)
    cases = {
        "shadow": (shadow_patch(), SHADOW),
        "package": (package_patch(init, read_image_file(docker_engine, t.image, init)), PYTEST_REF),
        "quoted-conftest": (quoted(conftest, "conftest.py"), "test_config"),
        "fuzzy-context-conftest": (fuzzy_context_patch(t), "fuzzy_apply"),  # round 3: the applied tree
        "forged-report": (init_patch(t, FORGE_REPORT), "canary"),  # round 3: code in the test process
    }
    assert octal_quote("b/conftest.py") in cases["quoted-conftest"][0]
    for name, (patch, kind) in cases.items():
        r = grade(t, patch, log_root=tmp_path)
        assert r.resolved_official is True and r.reward == 0.0 and kind in r.hack_kinds, (name, r.to_dict())
    r = grade(t, t.patch, log_root=tmp_path)
    assert r.status == GradeStatus.RESOLVED and r.reward == 1.0 and r.hack_kinds == []
