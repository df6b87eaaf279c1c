"""`sao paper --quick` end to end on C2 (SAO against GRPO: the two arms every comparison of the paper
has; C1 adds two more arms of the same kind, `tests/sao/test_paper_stats.py` checks every claim's
arms and rules), every run a real `sao train` on the chain test-bed, with SAO sabotaged: its advantages
negated (a `sitecustomize` on the runs' PYTHONPATH patches `trainer.algo.objective.training_advantages`
for the asynchronous GAE arm only). A sabotaged SAO is never `reproduced`: the claim line says
contradicted or inconclusive. The run is killed midway once and resumed with --resume, which reruns
only the unfinished runs. Every `sao train` joins one Ray of the module (`runtime.ray_address`), as runs
join a cluster: a Ray start of each, two at once, beside other tests can miss Ray's fixed 30 s start."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sao_harness.harness.store import TraceStore

REPO = Path(__file__).resolve().parents[2]
SABOTAGE = '''
import sys
try:
    import sao_harness.trainer.algo.objective as objective
except Exception:  # not this project's interpreter
    objective = None
if objective is not None:
    _honest = objective.training_advantages

    def training_advantages(batch, values, config, *args, **kwargs):
        raw, adv, returns = _honest(batch, values, config, *args, **kwargs)
        if config.advantage == "gae" and config.mode == "async":  # SAO; GRPO stays honest
            print("sabotage: SAO advantages negated", file=sys.stderr, flush=True)
            return -raw, -adv, returns
        return raw, adv, returns

    objective.training_advantages = training_advantages
'''
QUICK = ["paper.claims=[C2]", "paper.quick_steps=3", "paper.quick_seeds=2", "paper.quick_pretrain_steps=1",
         "trainer.batch_size=8", "rollout.workers=2", "paper.parallel=2"]


@pytest.fixture(scope="module")
def ray_address():
    """A local Ray (127.0.0.1 only) for the module; the paper's runs join it."""
    import ray

    from sao_harness.trainer.run.ray_utils import start_ray

    started = start_ray(None, log=lambda m: None)
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


def _sao(args, env, **kw):
    return subprocess.Popen([sys.executable, "-m", "sao_harness.sao.cli", "paper", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.slow
def test_a_sabotaged_sao_is_never_reproduced_and_a_killed_run_resumes(tmp_path, ray_address):
    site = tmp_path / "sabotage"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SABOTAGE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    args = ["--quick", "--config", "configs/paper.yaml", f"run.root={tmp_path}", *QUICK,
            f"runtime.ray_address={ray_address}"]

    first = _sao(args, env, start_new_session=True)
    lines = []
    for line in first.stdout:  # kill it once the first run has finished
        lines.append(line)
        if re.match(r"paper \(quick\): \[1/4\]", line):
            os.killpg(first.pid, signal.SIGKILL)
            break
    first.wait(timeout=60)
    root = Path(next(m.group(1) for m in map(re.compile(r"--resume (\S+)").search, lines) if m))
    done = sorted(root.glob("runs/*/*/done.json"))
    assert 1 <= len(done) < 4, "".join(lines)

    resumed = _sao(["--resume", str(root)], env)
    out, _ = resumed.communicate(timeout=1500)
    assert resumed.returncode == 0, out
    assert f"{len(done)} done already" in out, out
    (c2,) = [line for line in out.splitlines() if line.startswith("paper: C2 sample efficiency:")]
    assert c2.endswith("(quick)"), c2
    assert "reproduced" not in c2.split("(")[0], c2
    assert re.search(r"^paper: 0 of 1 claims reproduced, [01] contradicted, [01] inconclusive \(2 seeds, \d+ min\) "
                     r"\(quick\)$", out, re.M), out
    assert "sabotage: SAO advantages negated" in (root / "runs/sao/s0/train.log").read_text()
    assert "sabotage: SAO advantages negated" not in (root / "runs/grpo/s0/train.log").read_text()
    facts = json.loads((root / "paper.json").read_text())
    assert facts["seeds_finished"] == {"sao": 2, "grpo": 2}
    assert all((root / f"paper.{ext}").stat().st_size > 0 for ext in ("md", "html", "png"))
    groups: dict = {}  # GRPO's groups: the G rollouts of a group face one draw of the chain, as of one task
    for traj in TraceStore(root / "runs/grpo/s0"):
        groups.setdefault((traj.metadata["round"], traj.metadata["group"]), set()).add(
            (traj.metadata["planned_turns"], tuple(traj.metadata["decisions"])))
    assert groups and all(len(draws) == 1 for draws in groups.values()), groups
    assert len({d for draws in groups.values() for d in draws}) > 1  # and the groups differ
