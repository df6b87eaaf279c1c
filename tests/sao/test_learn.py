"""`sao learn`: resolved@1 from the evaluations' grades, the last line, the arms' configs, the report."""
import json
import math
import re

import pytest

from sao_harness.sao import learn
from sao_harness.sao.config import load_config
from sao_harness.sao.learn import ARM_OVERRIDES, WARM, eval_resolved, headline
from sao_harness.sao.learn_report import write_report
from sao_harness.tasks.grading.grade_status import INFRA_FAILURES, GradeStatus

LINE = re.compile(r"^learn: sao (\d+)% -> (\d+)%, grpo\+dis (\d+)% -> (\d+)%, grpo (\d+)% -> (\d+)% "
                  r"\(resolved@1, T=1, training tasks\)$")


def grades(d, records):
    d.mkdir(parents=True)
    (d / "grades.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


def g(iid, resolved, status=None):
    return {"instance_id": iid, "status": status or (GradeStatus.RESOLVED if resolved else GradeStatus.UNRESOLVED),
            "resolved_guarded": resolved}


def test_resolved_at_1_is_the_mean_over_tasks_and_samples_without_infra(tmp_path):
    train, heldout = ["a", "b"], ["c"]
    s0 = grades(tmp_path / "s0", [g("a", False), g("a", True), g("b", False), g("c", True)])  # a: last line wins
    s1 = grades(tmp_path / "s1", [g("a", True), g("b", False, GradeStatus.INFRA_FAILURE)])  # c: no prediction
    r = eval_resolved([s0, s1], train, heldout)
    # train: a (s0) 1, b (s0) 0, a (s1) 1; b (s1) is an infra failure -> 2 / 3
    assert r["train"] == {"resolved": 2, "graded": 3, INFRA_FAILURES: 1, "rate": pytest.approx(2 / 3)}
    assert r["heldout"] == {"resolved": 1, "graded": 1, INFRA_FAILURES: 1, "rate": 1.0}
    # an official-only resolution (guarded verdict false) is not resolved
    s2 = grades(tmp_path / "s2", [{"instance_id": "a", "status": "unresolved", "resolved_official": True,
                                   "resolved_guarded": False}])
    assert eval_resolved([s2], ["a"], [])["train"]["resolved"] == 0
    # nothing graded: no rate, not 0
    assert eval_resolved([tmp_path / "missing"], ["a"], [])["train"]["rate"] is None


def test_the_last_line_has_the_exact_form():
    results = {WARM: {"train": {"rate": 0.1875}}, "sao": {"train": {"rate": 0.53125}},
               "grpo+dis": {"train": {"rate": 0.25}}, "grpo": {"train": {"rate": 0.21875}}}
    line = headline(results, ["sao", "grpo+dis", "grpo"])
    assert LINE.match(line), line
    assert line == "learn: sao 19% -> 53%, grpo+dis 19% -> 25%, grpo 19% -> 22% (resolved@1, T=1, training tasks)"
    assert "n/a" in headline({WARM: {"train": {"rate": 0.2}}}, ["sao", "grpo+dis", "grpo"])  # an arm failed


def test_the_arms_are_the_algorithms_they_are_named_after(project_root):
    base = load_config(project_root / "configs/learn.yaml", [])
    assert base.trainer.mode == "async" and base.trainer.advantage == "gae" and base.trainer.policy_loss == "dis"
    sao = load_config(project_root / "configs/learn.yaml", ARM_OVERRIDES["sao"])
    grpo_dis = load_config(project_root / "configs/learn.yaml", ARM_OVERRIDES["grpo+dis"])
    grpo = load_config(project_root / "configs/learn.yaml", ARM_OVERRIDES["grpo"])
    assert (sao.trainer.mode, sao.trainer.advantage, sao.trainer.policy_loss) == ("async", "gae", "dis")
    assert (grpo_dis.trainer.mode, grpo_dis.trainer.advantage, grpo_dis.trainer.policy_loss) == ("sync", "grpo", "dis")
    assert (grpo.trainer.mode, grpo.trainer.advantage, grpo.trainer.policy_loss) == ("sync", "grpo", "ppo")
    for cfg in (grpo_dis, grpo):  # a sync batch is whole groups
        assert cfg.trainer.batch_size % cfg.trainer.group_size == 0
    # the split: held-out tasks are never trained on, and every task is a bundled one
    assert not set(base.learn.train_tasks) & set(base.learn.heldout_tasks)
    bundled = {p.name for p in (project_root / "tasks/bundled/tasks").iterdir()}
    assert set(base.learn.train_tasks) | set(base.learn.heldout_tasks) <= bundled


def test_report_files(tmp_path, project_root):
    cfg = load_config(project_root / "configs/learn.yaml", [])
    arm = tmp_path / "sao"
    arm.mkdir()
    (arm / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "time": 1000.0 + 10 * i, "rollout/reward_mean": i / 10, "policy/entropy": 0.5,
                    "critic/explained_variance": math.nan if i == 1 else 0.1 * i, "policy/dis_masked": 0.0,
                    "rollout/trained_total": 8 * i}) + "\n" for i in range(1, 8)))
    rate = {"resolved": 1, "graded": 4, INFRA_FAILURES: 0, "rate": 0.25}
    results = {WARM: {"train": rate, "heldout": rate}, "sao": {"train": {**rate, "resolved": 3, "rate": 0.75},
                                                               "heldout": rate}}
    for path, summary in (("sft/sft", {"steps": 150}),
                          ("sao-value/value_pretrain", {"steps": 40, "corpus": {"read": 64}})):
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "summary.json").write_text(json.dumps(summary))
    seconds = {"sao value data": 200.0, "sao value pretrain": 44.0, "train sao": 60.0}
    files = write_report(tmp_path / "report", cfg=cfg, root=tmp_path, results=results, arms=["sao"],
                         arm_dirs={"sao": arm}, stages=dict.fromkeys(seconds, "ok"), seconds=seconds,
                         wall_s=600.0, headline="learn: ...")
    assert sorted(f.name for f in files) == ["learn.html", "learn.json", "learn.md", "learn.png"]
    md = (tmp_path / "report/learn.md").read_text()
    assert ("| sao | 75.0% (3/4) | 25.0% (1/4) | 0 | value pretraining 244 s (64 episodes, 40 steps) | 7 | 56 | "
            "0.30 -> 0.50 |") in md
    assert "SFT: 150 steps" in md
    facts = json.loads((tmp_path / "report/learn.json").read_text())
    assert facts["results"]["sao"]["train"]["rate"] == 0.75 and facts["wall_s"] == 600.0
    assert facts["budgets"] == {"sft_steps": 150, "value_pretrain": {"seconds": 244.0, "episodes": 64, "steps": 40}}
    assert (tmp_path / "report/learn.png").stat().st_size > 10_000


def test_every_arm_gets_the_same_rl_time_and_value_pretraining_is_its_own_stage(tmp_path, project_root,
                                                                                  monkeypatch):
    """The sao arm's value pretraining runs as its own stages before every arm, and each arm's
    `sao train` gets trainer.max_minutes = learn.minutes, whatever the value stages cost."""
    ran, clock = [], [0.0]

    def run(self, name, args, config=None):  # each stage takes 2 minutes of the (fake) clock
        ran.append((name, args))
        clock[0] += 120.0
        return True

    monkeypatch.setattr(learn.Stages, "run", run)
    monkeypatch.setattr(learn.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(learn, "write_report", lambda *a, **k: [])
    cfg = load_config(project_root / "configs/learn.yaml", [f"run.root={tmp_path}", "learn.minutes=3",
                                                            "learn.samples=1"])
    learn.run_learn(cfg, log=lambda *_: None)
    names = [n for n, _ in ran]
    trains = [(n, a) for n, a in ran if n.startswith("train ")]
    assert [n for n, _ in trains] == [f"train {arm}" for arm in cfg.learn.arms]
    assert names.index("sao value pretrain") < names.index("train sao") == names.index(trains[0][0])
    for _, args in trains:
        assert [a for a in args if a.startswith("trainer.max_minutes=")] == ["trainer.max_minutes=3"]
    assert any(a.startswith("trainer.value_pretrain_checkpoint=") for a in dict(trains)["train sao"])
    assert not any(a.startswith("trainer.value_pretrain_checkpoint=") for a in dict(trains)["train grpo"])


@pytest.mark.slow
def test_sao_learn_runs_every_stage_end_to_end(tmp_path, project_root, docker_engine):
    """`sao learn` on the real path at the smallest scale: one training and one held-out task, 2 SFT
    steps, the sao arm (with its value pretraining) for 0.1 min, 1 sample; every stage runs, the report
    is written, the last line has the exact form (the numbers are whatever they are: this checks the
    plumbing, `make learn` the learning). The other arms are the same stages with the overrides that
    test_the_arms_are_the_algorithms_they_are_named_after checks (and sync mode: tests/trainer)."""
    import subprocess
    import sys

    args = [sys.executable, "-m", "sao_harness.sao.cli", "learn", "--config", str(project_root / "configs/learn.yaml"),
            f"run.root={tmp_path}", "run.name=mini", f"model.cache_dir={project_root / '.cache/sao'}",
            "learn.train_tasks=[sao-harness__spanlib-5]", "learn.heldout_tasks=[sao-harness__tablefmt-9]",
            "learn.samples=1", "learn.minutes=0.1", "sft.max_steps=2", "trainer.batch_size=2",
            "rollout.max_retries=0", "agent.max_iterations=2", "learn.value_episodes=2", "value_pretrain.max_steps=2",
            "learn.arms=[sao]"]
    r = subprocess.run(args, cwd=project_root, capture_output=True, text=True, timeout=1200)
    out = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.match(r"^learn: sao (\d+)% -> (\d+)% \(resolved@1, T=1, training tasks\)$", out[-1]), out[-1]
    (run,) = tmp_path.glob("mini-*")
    facts = json.loads((run / "report/learn.json").read_text())
    assert all(s["status"] == "ok" for s in facts["stages"].values())
    assert set(facts["results"]) == {WARM, "sao"}
    for result in facts["results"].values():  # one graded episode per task: a verdict, not an infra failure
        assert result["train"]["graded"] == 1 and result["heldout"]["graded"] == 1
    assert (run / "warm_start/config.json").is_file() and (run / "report/learn.html").is_file()
    assert {"sao value data", "sao value pretrain"} <= set(facts["stages"])  # the sao arm's critic was pretrained
    assert (run / "sao-value/value_pretrain/critic").is_dir()
    assert list((run / "sao" / "checkpoints").iterdir())
