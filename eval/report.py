"""The evaluation report: ``report.json``, ``report.md``, a self-contained ``report.html`` and PNG plots.

``write_report(eval_dir, tasks=, preds=, grades=, episodes=, manifest=, swebench_summary=, seconds=)
-> (report, files)``. swebench's own summary JSON (``<model>.<run_id>.json``) is left untouched and
referenced. ``report.json`` holds the guarded verdict next to the official one, hacking attempts,
infra failures (no verdict, never a 0), per-repository, per-difficulty and per-dataset tallies and
one row per instance (resolved, turns, tokens, status, time, dataset, format). Rates are over every
instance of the evaluation set (an instance without a verdict counts as not resolved, as in
swebench's summary). A mixed source (several datasets, ``tasks.formats.loaders.source_parts``) also gets a
"Per dataset" section: each dataset's resolved rates, formats and its own swebench summary JSON
(``eval.grading.dataset_reports``).
Plots (``plots/*.png``): turns per instance, tokens per instance, resolved by difficulty. The HTML
embeds them as ``data:image/png;base64`` URIs and loads nothing from elsewhere.
"""
from __future__ import annotations

import base64
import html
import json
import time
from collections import defaultdict
from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.eval.paths import write_json
from sao_harness.harness.trace import Status
from sao_harness.tasks.grading.grade_status import INFRA_FAILURES, GradeStatus

DIFFICULTY_ORDER = ("easy", "medium", "hard")
COLORS = {GradeStatus.RESOLVED: "#2e9d5b", GradeStatus.UNRESOLVED: "#8a94a6", GradeStatus.EMPTY: "#c9ced8",
          GradeStatus.NO_APPLY: "#e0a030", GradeStatus.INFRA_FAILURE: "#d04a4a", "no verdict": "#d04a4a"}
NO_VERDICT = (GradeStatus.INFRA_FAILURE, "not graded", "not run")  # counted in INFRA_FAILURES


# --- rows ----------------------------------------------------------------------------------
def dataset_of(task, default: str) -> str:
    """The dataset a task belongs to: the part of a mixed source it came from (``default``: the source)."""
    return getattr(task, "source", None) or default


def verdict_of(pred, grade, episode) -> str:
    """resolved | unresolved | empty | patch_does_not_apply | infra_failure | not run."""
    if pred is None:
        return GradeStatus.INFRA_FAILURE if episode and episode.get("status") == Status.INFRA_ERROR else "not run"
    if grade is None:
        return "not graded"
    return grade.get("status", "not graded")


def instance_rows(tasks, preds, grades, episodes, dataset: str | None = None) -> list[dict]:
    rows = []
    for t in tasks:
        iid = t.instance_id
        p, g, e = preds.get(iid), grades.get(iid), episodes.get(iid) or {}
        verdict = verdict_of(p, g, e or None)
        rows.append({
            "instance_id": iid, "repo": t.repo, "difficulty": t.difficulty or "unknown",
            "dataset": dataset_of(t, dataset or "unknown"), "format": getattr(t, "adapter", None) or "unknown",
            "resolved": bool(g and g.get("resolved_guarded")),
            "resolved_official": bool(g and g.get("resolved_official")),
            "verdict": verdict, "official_verdict": (g or {}).get("official_status", verdict),
            "hacking_attempts": int((g or {}).get("hacking_attempts") or 0),
            "stripped_files": list((g or {}).get("stripped_files") or []),
            "episode_status": e.get("status"), "turns": int(e.get("turns") or 0),
            "tokens": int(e.get("tokens") or 0), "action_tokens": int(e.get("action_tokens") or 0),
            "seconds": float(e.get("seconds") or 0.0),
            "grade_seconds": round(float((g or {}).get("seconds") or 0.0), 2),
            "patch_lines": len((p or {}).get("model_patch", "").splitlines()),
            "error": (g or {}).get("error") or e.get("error") or None,
        })
    return rows


def _tally(rows, key) -> dict:
    out: dict = defaultdict(lambda: {"total": 0, "resolved": 0, "resolved_official": 0, INFRA_FAILURES: 0})
    for r in rows:
        d = out[r[key]]
        d["total"] += 1
        d["resolved"] += r["resolved"]
        d["resolved_official"] += r["resolved_official"]
        d[INFRA_FAILURES] += r["verdict"] in NO_VERDICT
    for d in out.values():
        d["rate"] = round(d["resolved"] / d["total"], 4) if d["total"] else 0.0
        d["rate_official"] = round(d["resolved_official"] / d["total"], 4) if d["total"] else 0.0
    return dict(out)


def _difficulty_key(d: str) -> tuple:
    return (DIFFICULTY_ORDER.index(d) if d in DIFFICULTY_ORDER else len(DIFFICULTY_ORDER), d)


def _by_dataset(rows, reports: dict) -> dict:
    """Per dataset: the tally, its formats and its swebench summary (``reports``; None for a single dataset)."""
    out = _tally(rows, "dataset")
    for name, d in out.items():
        d["formats"] = sorted({r["format"] for r in rows if r["dataset"] == name})
        d["swebench_report"] = reports.get(name)
    return out


def build_report(*, tasks, preds, grades, episodes, manifest, swebench_summary, seconds,
                 dataset_reports: dict | None = None) -> dict:
    rows = instance_rows(tasks, preds, grades, episodes, manifest.get("dataset"))
    n = len(rows)
    res, off = sum(r["resolved"] for r in rows), sum(r["resolved_official"] for r in rows)
    infra = {r["instance_id"]: r["error"] or r["verdict"] for r in rows
             if r["verdict"] in NO_VERDICT}
    by_diff = _tally(rows, "difficulty")
    statuses: dict = defaultdict(int)
    for r in rows:
        statuses[r["verdict"]] += 1
    return {
        "name": manifest.get("name"), "model_name_or_path": manifest.get("model_name_or_path"),
        "model_path": manifest.get("model_path"), "checkpoint": manifest.get("checkpoint"),
        "dataset": manifest.get("dataset"), "split": manifest.get("split"), "sampling": manifest.get("sampling"),
        "guard": manifest.get("guard"), "swebench_report": swebench_summary,
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 1),
        "total": n, "predicted": sum(r["instance_id"] in preds for r in rows),
        "graded": n - len(infra),
        "resolved_guarded": res, "resolved_official": off,
        "resolved_rate_guarded": round(res / n, 4) if n else 0.0,
        "resolved_rate_official": round(off / n, 4) if n else 0.0,
        "verdicts": dict(statuses),
        "hacking_attempts": {r["instance_id"]: r["hacking_attempts"] for r in rows if r["hacking_attempts"]},
        "resolved_only_officially": [r["instance_id"] for r in rows if r["resolved_official"] and not r["resolved"]],
        INFRA_FAILURES: infra,
        "mean_turns": round(sum(r["turns"] for r in rows) / n, 2) if n else 0.0,
        "total_tokens": sum(r["tokens"] for r in rows),
        "by_repo": dict(sorted(_tally(rows, "repo").items())),
        "by_difficulty": dict(sorted(by_diff.items(), key=lambda kv: _difficulty_key(kv[0]))),
        "by_dataset": _by_dataset(rows, dataset_reports or {}),
        "instances": rows,
    }


# --- plots ---------------------------------------------------------------------------------
def _bar_colors(rows):
    return [COLORS.get(r["verdict"], "#8a94a6") for r in rows]


def make_plots(report: dict, out_dir: Path) -> dict[str, Path]:
    """turns.png, tokens.png, difficulty.png in ``out_dir``."""
    import matplotlib  # lazy: matplotlib is heavy, only the report draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg")
    from matplotlib.patches import Patch  # lazy: as above

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report["instances"]
    ids = [r["instance_id"] for r in rows]
    x = list(range(len(rows)))
    width = min(16.0, max(6.0, 0.35 * len(rows) + 2))
    label_ticks = len(rows) <= 60
    legend = [Patch(color=c, label=k) for k, c in COLORS.items()
              if k in {r["verdict"] for r in rows} or k == GradeStatus.RESOLVED]
    files = {}

    def finish(fig, ax, name, title, ylabel):
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if label_ticks:
            ax.set_xticks(x)
            ax.set_xticklabels(ids, rotation=60, ha="right", fontsize=7)
        else:
            ax.set_xlabel(f"{len(rows)} instances")
            ax.set_xticks([])
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=90)
        plt.close(fig)
        files[name] = path

    fig, ax = plt.subplots(figsize=(width, 4))
    ax.bar(x, [r["turns"] for r in rows], color=_bar_colors(rows))
    ax.legend(handles=legend, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    finish(fig, ax, "turns.png", "Turns per instance (colour: guarded verdict)", "turns")

    fig, ax = plt.subplots(figsize=(width, 4))
    act = [r["action_tokens"] for r in rows]
    obs = [r["tokens"] - r["action_tokens"] for r in rows]
    ax.bar(x, obs, color="#9ab6d9", label="observation tokens")
    ax.bar(x, act, bottom=obs, color="#2f5d94", label="action tokens")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    finish(fig, ax, "tokens.png", "Tokens per instance", "tokens")

    diffs = list(report["by_difficulty"].items())
    fig, ax = plt.subplots(figsize=(6, 4))
    dx = list(range(len(diffs)))
    tot = [d["total"] for _, d in diffs]
    res = [d["resolved"] for _, d in diffs]
    ax.bar([i - 0.2 for i in dx], tot, width=0.4, color="#c9ced8", label="instances")
    ax.bar([i + 0.2 for i in dx], res, width=0.4, color=COLORS[GradeStatus.RESOLVED], label="resolved (guarded)")
    for i, (_, d) in enumerate(diffs):
        ax.text(i + 0.2, d["resolved"], f"{d['rate']:.0%}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(dx)
    ax.set_xticklabels([k for k, _ in diffs])
    ax.set_title("Resolved by difficulty")
    ax.set_ylabel("instances")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out_dir / "difficulty.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    files["difficulty.png"] = path
    return files


# --- text renderings -----------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{x:.1%}"


def _repo_table(report) -> list[list[str]]:
    return [[repo, str(d["total"]), str(d["resolved"]), _pct(d["rate"]), str(d["resolved_official"]),
             str(d[INFRA_FAILURES])] for repo, d in report["by_repo"].items()]


REPO_HEADER = ["repository", "instances", "resolved", "rate", "resolved (official)", "no verdict"]
DATASET_HEADER = ["dataset", "format", "instances", "resolved", "rate", "resolved (official)", "rate (official)",
                  "no verdict", "swebench summary"]


def _dataset_table(report) -> list[list[str]]:
    """The per-dataset rows; [] unless the evaluation set mixes datasets."""
    by = report.get("by_dataset") or {}
    if len(by) < 2:
        return []
    return [[name, ", ".join(d["formats"]), str(d["total"]), str(d["resolved"]), _pct(d["rate"]),
             str(d["resolved_official"]), _pct(d["rate_official"]), str(d[INFRA_FAILURES]),
             str(d["swebench_report"])] for name, d in by.items()]
ROW_HEADER = ["instance", "repo", "difficulty", "verdict", "official", "hacking", "turns", "tokens", "episode",
              "time (s)"]


def _instance_cells(r) -> list[str]:
    return [r["instance_id"], r["repo"], r["difficulty"], r["verdict"], r["official_verdict"],
            str(r["hacking_attempts"]), str(r["turns"]), str(r["tokens"]), r["episode_status"] or "-",
            f"{r['seconds']:.1f}"]


def _headline(report) -> list[tuple[str, str]]:
    n = report["total"]
    s = report.get("sampling") or {}
    return [
        ("resolved (guarded)", f"{report['resolved_guarded']}/{n} ({_pct(report['resolved_rate_guarded'])})"),
        ("resolved (official swebench)",
         f"{report['resolved_official']}/{n} ({_pct(report['resolved_rate_official'])})"),
        ("model", str(report.get("model_name_or_path"))),
        ("dataset", f"{report.get('dataset')} ({report.get('split')})"),
        ("sampling", f"temperature {s.get('temperature')}, top_p {s.get('top_p')}, max_tokens {s.get('max_tokens')}"),
        ("hacking attempts", str(sum(report["hacking_attempts"].values())) +
         (f" in {', '.join(report['hacking_attempts'])}" if report["hacking_attempts"] else "")),
        ("no verdict (infrastructure failures)", str(len(report[INFRA_FAILURES])) +
         (f": {', '.join(report[INFRA_FAILURES])}" if report[INFRA_FAILURES] else "")),
        ("mean turns", str(report["mean_turns"])),
        ("swebench summary", str(report.get("swebench_report"))),
    ]


def render_md(report: dict, plots: dict[str, Path], eval_dir: Path) -> str:
    def table(header, rows):
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        return "\n".join(out)

    lines = [f"# Evaluation {report['name']}", ""]
    lines += [f"- **{k}**: {v}" for k, v in _headline(report)]
    if datasets := _dataset_table(report):
        lines += ["", "## Per dataset", "", table(DATASET_HEADER, datasets)]
    lines += ["", "## Per repository", "", table(REPO_HEADER, _repo_table(report)), "", "## Plots", ""]
    for name, path in plots.items():
        lines.append(f"![{name}]({path.relative_to(eval_dir).as_posix()})")
    lines += ["", "## Instances", "", table(ROW_HEADER, [_instance_cells(r) for r in report["instances"]]), ""]
    if report[INFRA_FAILURES]:
        lines += ["## Infra failures", ""] + [f"- {k}: {v}" for k, v in report[INFRA_FAILURES].items()] + [""]
    return "\n".join(lines)


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #1d2430; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; }
.big { font-size: 40px; font-weight: 700; color: #2f5d94; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #d5dae3; padding: 4px 8px; text-align: left; }
th { background: #eef1f6; } tr.resolved td:nth-child(4) { color: #2e9d5b; font-weight: 600; }
tr.infra_failure td:nth-child(4) { color: #d04a4a; font-weight: 600; }
img { max-width: 100%; border: 1px solid #e3e6ec; margin: 6px 0; display: block; }
"""


def render_html(report: dict, plots: dict[str, Path]) -> str:
    e = html.escape

    def table(header, rows, classes=None):
        head = "".join(f"<th>{e(h)}</th>" for h in header)
        body = []
        for i, row in enumerate(rows):
            cls = f' class="{e(classes[i])}"' if classes else ""
            body.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
        return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"

    imgs = []
    for name, path in plots.items():
        data = base64.b64encode(Path(path).read_bytes()).decode()
        imgs.append(f'<img alt="{e(name)}" src="data:image/png;base64,{data}">')
    headline = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _headline(report))
    rows = report["instances"]
    datasets = _dataset_table(report)
    per_dataset = f"<h2>Per dataset</h2>\n{table(DATASET_HEADER, datasets)}\n" if datasets else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Evaluation {e(str(report['name']))}</title>
<style>{CSS}</style></head><body>
<h1>Evaluation {e(str(report['name']))}</h1>
<div class="big">{_pct(report['resolved_rate_guarded'])} resolved</div>
<table>{headline}</table>
{per_dataset}<h2>Per repository</h2>
{table(REPO_HEADER, _repo_table(report))}
<h2>Plots</h2>
{''.join(imgs)}
<h2>Instances</h2>
{table(ROW_HEADER, [_instance_cells(r) for r in rows], [r['verdict'] for r in rows])}
<p>Generated {e(report['generated'])} by sao-harness.</p>
</body></html>
"""


def write_report(eval_dir, *, tasks, preds, grades, episodes, manifest, swebench_summary, seconds=0.0,
                 dataset_reports: dict | None = None):
    """Write report.json / report.md / report.html / plots; return (report, {kind: path}); each dataset's
    swebench summary (``dataset_reports``, a mixed source) is named ``swebench[<dataset>]``."""
    eval_dir = Path(eval_dir)
    report = build_report(tasks=tasks, preds=preds, grades=grades, episodes=episodes, manifest=manifest,
                          swebench_summary=swebench_summary, seconds=seconds, dataset_reports=dataset_reports)
    plots = make_plots(report, eval_dir / "plots")
    write_json(eval_dir / "report.json", report)
    (eval_dir / "report.md").write_text(render_md(report, plots, eval_dir))
    (eval_dir / "report.html").write_text(render_html(report, plots))
    files = {"report.json": str(eval_dir / "report.json"), "report.md": str(eval_dir / "report.md"),
             "report.html": str(eval_dir / "report.html"), "plots": str(eval_dir / "plots")}
    if swebench_summary:
        files["swebench"] = swebench_summary
    files |= {f"swebench[{name}]": path for name, path in (dataset_reports or {}).items() if path}
    return report, files


def load_report(path) -> dict:
    """A ``report.json`` (or the eval directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    if not p.is_file():
        raise UserError(f"no evaluation report at {p}")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{p}: not valid JSON ({err.msg})") from None
