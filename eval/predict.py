"""Episodes -> predictions: one SWE-bench prediction per instance, appended as its episode ends.

``predict(run_cfg, tasks, paths, policy, engine=, proxy=, log=) -> {instance_id: prediction}`` runs
the episodes (``harness.rollout.run_rollout``, not graded) for those of ``tasks`` (loaded and pre-flighted
once, by ``eval.run.select_tasks``; their images ready) without a prediction in ``predictions.jsonl`` and
appends one line per finished episode there, and one to ``episodes.jsonl``.
An infra error gets no prediction (no verdict, never a 0): it is retried on the next start.
"""
from __future__ import annotations

import pyarrow.parquet as pq

from sao_harness.eval.paths import EvalPaths, JsonlLog, latest_by_instance
from sao_harness.eval.policy import Policy
from sao_harness.harness.rollout import run_rollout
from sao_harness.harness.store import TraceStore, read_shard
from sao_harness.harness.trace import Status


def prediction(traj, model_name: str) -> dict:
    return {"instance_id": traj.task_id, "model_name_or_path": model_name, "model_patch": traj.patch or ""}


def episode_record(traj, shard=None) -> dict:
    t = traj.timings or {}
    err = traj.metadata.get(Status.INFRA_ERROR) or (traj.metadata.get("agent") or {}).get("error")
    return {"instance_id": traj.task_id, "traj_id": traj.traj_id, "shard": str(shard) if shard else None,
            "status": traj.status, "turns": traj.turns, "tokens": traj.num_tokens,
            "action_tokens": traj.num_action_tokens, "seconds": round(float(t.get("episode_s", 0.0)), 2),
            "patch_lines": len(traj.patch.splitlines()), "error": err,
            "attempt": traj.metadata.get("attempt", 0)}


def reconcile(paths: EvalPaths, model_name: str, wanted: set[str], preds: dict, episodes: JsonlLog,
              predictions: JsonlLog, log=print) -> int:
    """Trajectories stored without their prediction (a crash between the two): write the prediction."""
    store = TraceStore(paths.dir)
    store.clean_partial()
    n = 0
    for shard in store.shards():
        t = pq.read_table(shard, columns=["task_id", "status"])
        ids = t.column("task_id").to_pylist()
        statuses = t.column("status").to_pylist()
        if not any(i in wanted and i not in preds and s != Status.INFRA_ERROR for i, s in zip(ids, statuses)):
            continue
        for traj in read_shard(shard):
            if traj.task_id in wanted and traj.task_id not in preds and traj.status != Status.INFRA_ERROR:
                episodes.append(episode_record(traj, shard))
                rec = prediction(traj, model_name)
                predictions.append(rec)
                preds[traj.task_id] = rec
                n += 1
    if n:
        log(f"resume: {n} stored trajectory(ies) had no prediction line yet; written")
    return n


def predict(run_cfg, tasks, paths: EvalPaths, policy: Policy, *, engine=None, proxy=None, log=print) -> dict:
    """Episodes for the tasks without a prediction; returns {instance_id: prediction}."""
    predictions, episodes = JsonlLog(paths.predictions), JsonlLog(paths.episodes)
    wanted = {t.instance_id for t in tasks}
    preds = {iid: p for iid, p in latest_by_instance(predictions.read()).items() if iid in wanted}
    reconcile(paths, policy.model_name, wanted, preds, episodes, predictions, log)
    todo = [t for t in tasks if t.instance_id not in preds]
    if len(preds):
        log(f"resume: {len(preds)}/{len(tasks)} instance(s) already predicted in {paths.predictions}")
    if not todo:
        return preds

    def on_trajectory(traj, shard):
        episodes.append(episode_record(traj, shard))
        if traj.status == Status.INFRA_ERROR:  # no verdict, never a 0: no prediction, retried on the next run
            return
        rec = prediction(traj, policy.model_name)
        predictions.append(rec)
        preds[traj.task_id] = rec

    log(f"predicting {len(todo)} instance(s) with {policy.model_name} (temperature {run_cfg.sampling.temperature:g}, "
        f"top_p {run_cfg.sampling.top_p:g}, {run_cfg.rollout.workers} at a time)")
    # the tasks as select_tasks loaded them (not again), their images prepared by run_eval
    run_rollout(run_cfg, todo, engine=engine, proxy=proxy, grade=False, on_trajectory=on_trajectory,
                images_ready=True, log=log)
    return preds
