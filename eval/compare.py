"""`sao eval compare A B`: what changed between two evaluations, instance by instance.

A and B are eval directories (``<run>/eval/<name>``), their ``report.json``, or run directories
(their newest eval). ``compare(a, b) -> dict`` classifies each instance of either run:
``newly_resolved`` (not resolved in A, resolved in B), ``newly_failed`` (resolved in A, not in B),
``unchanged_resolved``, ``unchanged_unresolved``, ``only_in_a``, ``only_in_b``; plus both resolved
rates (guarded and official) over the instances the two runs share and over each whole run.
"""
from __future__ import annotations

from pathlib import Path

from sao_harness.core.errors import UserError
from sao_harness.eval.report import load_report

KINDS = ("newly_resolved", "newly_failed", "unchanged_resolved", "unchanged_unresolved", "only_in_a", "only_in_b")


def find_report(path: str | Path) -> Path:
    """The report.json that ``path`` names (see module doc)."""
    p = Path(path)
    if p.is_file():
        return p
    if (p / "report.json").is_file():
        return p / "report.json"
    evals = sorted((p / "eval").glob("*/report.json"), key=lambda f: f.stat().st_mtime) if p.is_dir() else []
    if evals:
        return evals[-1]
    raise UserError(f"{path}: no evaluation report (an eval dir with report.json, a report.json, or a run dir "
                    "with eval/*/report.json)")


def _rate(rows: list[dict], key: str) -> float:
    return round(sum(bool(r[key]) for r in rows) / len(rows), 4) if rows else 0.0


def compare(a: str | Path, b: str | Path) -> dict:
    pa, pb = find_report(a), find_report(b)
    ra, rb = load_report(pa), load_report(pb)
    rows_a = {r["instance_id"]: r for r in ra.get("instances", [])}
    rows_b = {r["instance_id"]: r for r in rb.get("instances", [])}
    changes = []
    for iid in list(rows_a) + [i for i in rows_b if i not in rows_a]:
        x, y = rows_a.get(iid), rows_b.get(iid)
        if x is None:
            kind = "only_in_b"
        elif y is None:
            kind = "only_in_a"
        elif x["resolved"] != y["resolved"]:
            kind = "newly_resolved" if y["resolved"] else "newly_failed"
        else:
            kind = "unchanged_resolved" if x["resolved"] else "unchanged_unresolved"
        changes.append({"instance_id": iid, "change": kind,
                        "a": x and {k: x[k] for k in ("verdict", "official_verdict", "turns", "tokens")},
                        "b": y and {k: y[k] for k in ("verdict", "official_verdict", "turns", "tokens")}})
    shared = [i for i in rows_a if i in rows_b]
    return {
        "a": {"report": str(pa), "name": ra.get("name"), "model": ra.get("model_name_or_path"),
              "resolved_rate_guarded": ra.get("resolved_rate_guarded"),
              "resolved_rate_official": ra.get("resolved_rate_official"), "total": ra.get("total"),
              "shared_rate_guarded": _rate([rows_a[i] for i in shared], "resolved"),
              "shared_rate_official": _rate([rows_a[i] for i in shared], "resolved_official")},
        "b": {"report": str(pb), "name": rb.get("name"), "model": rb.get("model_name_or_path"),
              "resolved_rate_guarded": rb.get("resolved_rate_guarded"),
              "resolved_rate_official": rb.get("resolved_rate_official"), "total": rb.get("total"),
              "shared_rate_guarded": _rate([rows_b[i] for i in shared], "resolved"),
              "shared_rate_official": _rate([rows_b[i] for i in shared], "resolved_official")},
        "shared": len(shared),
        "counts": {k: sum(c["change"] == k for c in changes) for k in KINDS},
        "instances": changes,
    }


def render(result: dict) -> str:
    a, b = result["a"], result["b"]
    lines = [f"A: {a['name']} ({a['model']})  {a['report']}", f"B: {b['name']} ({b['model']})  {b['report']}", ""]
    width = max([len(c["instance_id"]) for c in result["instances"]] + [8])
    for kind in KINDS:
        items = [c for c in result["instances"] if c["change"] == kind]
        if not items:
            continue
        lines.append(f"{kind.replace('_', ' ')} ({len(items)}):")
        for c in items:
            va = c["a"]["verdict"] if c["a"] else "-"
            vb = c["b"]["verdict"] if c["b"] else "-"
            lines.append(f"  {c['instance_id']:<{width}}  {va} -> {vb}")
    counts = result["counts"]
    shared = (f"shared instances: {result['shared']}; newly resolved {counts['newly_resolved']}, newly failed "
              f"{counts['newly_failed']}, unchanged {counts['unchanged_resolved'] + counts['unchanged_unresolved']}")
    guarded = (f"resolved rate (guarded, shared instances): {a['shared_rate_guarded']:.1%} -> "
               f"{b['shared_rate_guarded']:.1%}")
    official = (f"resolved rate (official, shared instances): {a['shared_rate_official']:.1%} -> "
                f"{b['shared_rate_official']:.1%}")
    whole = (f"resolved rate (guarded, whole runs): {(a['resolved_rate_guarded'] or 0):.1%} of {a['total']} -> "
             f"{(b['resolved_rate_guarded'] or 0):.1%} of {b['total']}")
    lines += ["", shared, guarded, official, whole]
    return "\n".join(lines)
