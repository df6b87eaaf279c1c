"""`sao train`, `sao value-pretrain`, `sao sft`, `sao runs plot RUN`, `sao images pull|save` (heavy imports
happen in the handlers)."""
from __future__ import annotations

import sys

from sao_harness.harness.runner import load_tasks


def register(sub, add_config_args):
    p = sub.add_parser("train", help="asynchronous SAO training (trainer.mode=sync: the group baseline); "
                                     "resumes a run directory that has a checkpoint")
    add_config_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("value-pretrain", help="regress the critic on Monte-Carlo returns of stored traces")
    add_config_args(p)
    p.set_defaults(func=cmd_value_pretrain)

    p = sub.add_parser("sft", help="supervised warm start (TRL SFTTrainer) on the action tokens of stored "
                                   "trajectories; writes a model directory for model.path")
    add_config_args(p)
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("runs", help="inspect run directories")
    rsub = p.add_subparsers(dest="runs_cmd", metavar="ACTION", required=True)
    plot = rsub.add_parser("plot", help="PNG curves of a run's metrics (into RUN/plots)")
    plot.add_argument("run", metavar="RUN", help="a run directory (holding metrics.jsonl)")
    plot.add_argument("--out", metavar="DIR", default=None, help="write the PNGs here instead of RUN/plots")
    plot.set_defaults(func=cmd_runs_plot)
    compare = rsub.add_parser("compare", help="several runs' reward, explained variance and masked-fraction "
                                              "curves side by side (PNG, HTML) and a summary table")
    compare.add_argument("runs", metavar="RUN", nargs="+", help="run directories (each holding metrics.jsonl)")
    compare.add_argument("--out", metavar="DIR", default=".", help="write compare.png and compare.html here")
    compare.set_defaults(func=cmd_runs_compare)

    p = sub.add_parser("images", help="task images on every sandbox node: pull, save")
    isub = p.add_subparsers(dest="images_command", metavar="SUBCOMMAND", required=True)
    q = isub.add_parser("pull", help="pull (or build) every selected task's image on each sandbox node")
    add_config_args(q)
    q.set_defaults(func=cmd_images_pull)
    q = isub.add_parser("save", help="docker save the selected tasks' images into DIR (a dir: image source)")
    q.add_argument("--dir", required=True, metavar="DIR", help="directory for the tarballs")
    add_config_args(q)
    q.set_defaults(func=cmd_images_save)


def cmd_images_pull(args) -> int:
    from sao_harness.trainer.run.images import cmd_pull  # lazy: keeps `sao --help` fast (docker-py, Ray)

    return cmd_pull(args)


def cmd_images_save(args) -> int:
    from sao_harness.tasks.images.prepare import cmd_save  # lazy: keeps `sao --help` fast (docker-py)

    return cmd_save(args)


def _log(msg: str) -> None:
    print(msg, flush=True)


def cmd_train(args) -> int:
    # once, before torch loads and the first episode (swe: pre-flighted)
    tasks = load_tasks(args.cfg, args.cfg.trainer.env, log=_log)
    # lazy: keep `sao --help` fast (torch)
    from sao_harness.trainer.run.loop import train
    from sao_harness.trainer.run.ray_utils import LoopError

    try:
        train(args.cfg, tasks, log=_log)
    except LoopError as e:
        print(f"sao train: error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_value_pretrain(args) -> int:
    # lazy: keep `sao --help` fast
    from sao_harness.trainer.warm.value_pretrain import cmd_value_pretrain as run

    return run(args)


def cmd_sft(args) -> int:
    # lazy: keep `sao --help` fast
    from sao_harness.trainer.warm.sft import cmd_sft as run

    return run(args)


def cmd_runs_plot(args) -> int:
    # lazy: keep `sao --help` fast
    from sao_harness.trainer.report.plots import cmd_runs_plot as run

    return run(args)


def cmd_runs_compare(args) -> int:
    # lazy: keep `sao --help` fast
    from sao_harness.trainer.report.compare import cmd_runs_compare as run

    return run(args)
