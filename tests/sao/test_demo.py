"""`sao demo`: its stages and their budgets, the last line, and a figure without flat lines."""
import json
import math
import re

from sao_harness.sao import demo
from sao_harness.sao.config import load_config
from sao_harness.sao.demo import headline
from sao_harness.sao.demo_report import panels, write_demo_report
from sao_harness.tasks.grading.grade_status import INFRA_FAILURES

LINE = re.compile(r"^demo: toy reward (\d+\.\d\d) -> (\d+\.\d\d) \(EV (-?\d+\.\d\d)\), resolved base (\d+)% -> "
                  r"sft (\d+)% -> sao (\d+)% \((\d+) episodes\)$")


def rate(resolved, graded, infra=0):
    return {"resolved": resolved, "graded": graded, INFRA_FAILURES: infra,
            "rate": resolved / graded if graded else None}


def test_the_last_line_has_the_exact_form_and_the_smallest_episode_count():
    toy = {"reward_first5": 0.48, "reward_last5": 0.91, "ev_last5": 0.62}
    line = headline(toy, {"base": rate(0, 8), "sft": rate(2, 8), "sao": rate(3, 7, infra=1)})
    m = LINE.match(line)
    assert m, line
    assert m.groups() == ("0.48", "0.91", "0.62", "0", "25", "43", "7")
    # a path that did not run says n/a, never a made-up 0
    assert headline({}, {"base": rate(0, 8)}) == ("demo: toy reward n/a -> n/a (EV n/a), resolved base 0% -> "
                                                  "sft n/a -> sao n/a (8 episodes)")


def test_demo_runs_the_testbed_then_the_real_path_with_its_budgets(tmp_path, project_root, monkeypatch):
    ran = []
    monkeypatch.setattr(demo.Stages, "run", lambda self, name, args, config=None: ran.append((name, args, config))
                        or True)
    monkeypatch.chdir(project_root)
    cfg = load_config(project_root / "configs/demo.yaml", [f"run.root={tmp_path}", "demo.samples=3"])
    assert demo.run_demo(cfg, log=lambda *_: None) == 0
    names = [n for n, _, _ in ran]
    assert names[:4] == ["test-bed: sao train", "expert traces", "sft warm start", "sao train"]
    assert names[4:] == [f"eval {p} (sample {i}/3)" for p in ("base", "sft", "sao") for i in (1, 2, 3)]
    by_name = {n: (a, c) for n, a, c in ran}
    toy_args, toy_conf = by_name["test-bed: sao train"]
    assert toy_conf.name == "toy.yaml" and "env: toy" in toy_conf.read_text()
    assert f"trainer.max_steps={cfg.demo.toy_steps}" in toy_args
    assert f"sft.max_steps={cfg.demo.sft_steps}" in by_name["sft warm start"][0]
    assert f"trainer.max_minutes={cfg.demo.sao_minutes:g}" in by_name["sao train"][0]
    assert "eval.checkpoint=null" in by_name["eval base (sample 1/3)"][0]
    assert "eval.checkpoint=latest" in by_name["eval sao (sample 2/3)"][0]
    seeds = {a for n, args, _ in ran if n.startswith("eval sft") for a in args if a.startswith("run.seed=")}
    assert len(seeds) == 3  # every sample its own seed


def test_panels_leave_out_curves_without_data(tmp_path):
    toy = [{"step": i, "time": float(i), "rollout/reward_mean": 0.5 + i / 100, "critic/explained_variance": math.nan}
           for i in range(1, 11)]
    items = panels({"toy": toy, "sao": []}, {"base": rate(0, 8), "sft": rate(2, 8), "sao": rate(0, 0)})
    assert [(kind, title) for kind, title, *_ in items] == [("curve", "test-bed: reward per SAO step"),
                                                           ("bars", "resolved at T=1 (episodes graded)")]
    assert items[-1][2] == ["base", "sft"]  # a policy with no graded episode has no bar


def test_report_files(tmp_path):
    toy_dir, sao_dir = tmp_path / "toy", tmp_path / "sao"
    for d, n in ((toy_dir, 40), (sao_dir, 6)):
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(
            {"step": i, "time": float(i), "rollout/reward_mean": i / n, "critic/explained_variance": 0.02 * i})
            + "\n" for i in range(1, n + 1)))
    report = tmp_path / "sao" / "eval" / "sao-s0"
    report.mkdir(parents=True)
    (report / "report.html").write_text("<p>report</p>")
    files = write_demo_report(tmp_path, toy_dir=toy_dir, sao_dir=sao_dir, toy={"reward_first5": 0.1},
                              resolved={"base": rate(0, 4), "sao": rate(1, 4)}, evals={"sao": [report]},
                              stages={"sao train": "ok"}, seconds={"sao train": 90.0}, wall_s=540.0,
                              headline="demo: ...")
    assert sorted(f.name for f in files) == ["demo.html", "demo.json", "demo.png"]
    page = (tmp_path / "demo.html").read_text()
    assert "href='sao/eval/sao-s0/report.html'" in page and "data:image/png;base64," in page
    assert json.loads((tmp_path / "demo.json").read_text())["demo_s"] == 540.0
    assert (tmp_path / "demo.png").stat().st_size > 10_000
