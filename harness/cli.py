"""`sao trace`, `sao model`, `sao rollout`: the harness's own subcommands."""
from __future__ import annotations

import json
import sys

from sao_harness.core.errors import UserError


def register(sub, add_config_args):
    p = sub.add_parser("trace", help="inspect trace shards")
    tsub = p.add_subparsers(dest="trace_cmd", metavar="ACTION", required=True)
    show = tsub.add_parser("show", help="print a trajectory, segments told apart")
    show.add_argument("path", metavar="FILE", help="a trace shard (.parquet), a traces/ dir or a run dir")
    show.add_argument("--index", type=int, default=0, help="which trajectory (default 0; negative counts from the end)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--tokenizer", default=None,
                      help="decode tokens with this tokenizer dir (default: the one in the trace's metadata)")
    show.set_defaults(func=cmd_trace_show)
    ls = tsub.add_parser("list", help="one line per trajectory")
    ls.add_argument("path", metavar="PATH")
    ls.set_defaults(func=cmd_trace_list)

    p = sub.add_parser("model", help="models: build the tiny test model")
    msub = p.add_subparsers(dest="model_cmd", metavar="ACTION", required=True)
    tiny = msub.add_parser("tiny", help="build the tiny Qwen3-MoE model + tokenizer (no hub)")
    tiny.add_argument("--out", required=True, metavar="DIR")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=cmd_model_tiny)

    p = sub.add_parser("rollout", help="run agent episodes over a task source, writing traces")
    add_config_args(p)
    p.set_defaults(func=cmd_rollout)


def cmd_rollout(args) -> int:
    from sao_harness.harness.rollout import run_rollout  # lazy: CLI handler (keeps `sao --help` fast)
    from sao_harness.harness.runner import load_tasks

    # once, before the first image or episode: loaded and pre-flighted (`tasks: N of M usable`), then passed down
    tasks = load_tasks(args.cfg, "swe")
    stats = run_rollout(args.cfg, tasks)
    return 0 if stats.done + stats.skipped >= stats.total else 1


def cmd_model_tiny(args) -> int:
    from sao_harness.harness.tiny_model import build_tiny_model  # lazy: CLI handler (keeps `sao --help` fast)

    out = build_tiny_model(args.out, args.seed)
    print(f"tiny model written to {out}")
    return 0


def cmd_trace_list(args) -> int:
    from sao_harness.harness.store import read_traces  # lazy: CLI handler (pyarrow)

    for i, t in enumerate(read_traces(args.path)):
        print(f"{i:4d} {t.traj_id} task={t.task_id} status={t.status} reward={t.reward} turns={t.turns} "
              f"tokens={t.num_tokens} action_tokens={t.num_action_tokens} versions={t.versions}")
    return 0


def _load_tokenizer(path):
    if not path:
        return None
    try:
        from transformers import AutoTokenizer  # lazy: heavy

        return AutoTokenizer.from_pretrained(path)
    except Exception:
        return None


def cmd_trace_show(args) -> int:
    from sao_harness.harness.store import read_traces  # lazy: CLI handler (pyarrow)

    trajs = read_traces(args.path)
    try:
        t = trajs[args.index]
    except IndexError:
        raise UserError(f"--index {args.index}: {args.path} holds {len(trajs)} trajectories") from None
    tok = _load_tokenizer(args.tokenizer or t.metadata.get("tokenizer"))
    if args.json:
        row = t.to_row()
        row["grading"], row["timings"], row["metadata"] = t.grading, t.timings, t.metadata
        row["segments"] = [{"kind": s.kind, "start": start, "length": len(s),
                            **({"text": tok.decode(s.token_ids)} if tok else {})}
                           for s, start in zip(t.segments, _starts(t))]
        json.dump(row, sys.stdout)
        print()
        return 0
    _print_human(t, tok)
    return 0


def _starts(t):
    pos = 0
    for s in t.segments:
        yield pos
        pos += len(s)


def _print_human(t, tok) -> None:
    from rich.console import Console  # lazy: only `sao trace show` prints with rich
    from rich.text import Text

    console = Console(highlight=False)
    color = console.is_terminal
    console.print(f"trajectory {t.traj_id}  task={t.task_id}  status={t.status}  reward={t.reward}  "
                  f"turns={t.turns}  tokens={t.num_tokens} (action {t.num_action_tokens})  versions={t.versions}")
    if t.breaks:
        console.print(f"sequence breaks at tokens {t.breaks}")
    for i, (s, start) in enumerate(zip(t.segments, _starts(t))):
        body = tok.decode(s.token_ids) if tok else " ".join(map(str, s.token_ids))
        if s.kind == "action":
            lp = sum(s.logp_rollout) / max(len(s), 1)
            head = f"[ACTION {i} @{start} n={len(s)} v={sorted(set(s.policy_version))} mean_logp={lp:.3f}]"
            style = "bold green"
        else:
            head = f"[OBSERVATION {i} @{start} n={len(s)}]"
            style = "cyan"
        if color:
            console.print(Text(head, style=style))
            console.print(Text(body, style="green" if s.kind == "action" else "default"))
        else:
            print(head)
            print(body)
            print(f"[/{s.kind.upper()} {i}]")
    if t.patch:
        console.print(Text("[PATCH]", style="bold") if color else "[PATCH]")
        print(t.patch)
