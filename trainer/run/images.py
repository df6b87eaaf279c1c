"""``sao images pull``: the selected tasks' images on every sandbox node.

Without ``runtime.ray_address``: ``tasks.images.prepare_node`` here. With it: one Ray task per sandbox
node (the alive nodes with ``rollout.node_resources``; every node when that is empty), each running
``prepare_node`` on its own Docker engine. Ray belongs here, with the ``runtime`` section that names it.
"""
from __future__ import annotations

from sao_harness.core.errors import UserError
from sao_harness.tasks.formats.loaders import tasks_from_config
from sao_harness.tasks.images.prepare import prepare_node, summary_line, task_images
from sao_harness.trainer.run.ray_utils import start_ray


def sandbox_nodes(need: dict) -> list[dict]:
    """The alive Ray nodes that hold every resource of ``need`` (all alive nodes when it is empty)."""
    import ray  # lazy: heavy

    return [n for n in ray.nodes() if n["Alive"] and all(n["Resources"].get(k, 0) >= v for k, v in need.items())]


def pull_everywhere(cfg, source: str, tasks, *, log=print) -> list[dict]:
    """``prepare_node`` here, or with ``runtime.ray_address`` once on every sandbox node (module doc)."""
    if not cfg.runtime.ray_address:
        return [prepare_node(cfg, source, tasks, log=log)]
    import ray  # lazy: heavy
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # lazy: part of ray
    from tqdm import tqdm  # lazy: only the command shows a bar

    start_ray(cfg.runtime.ray_address, log=log)
    nodes = sandbox_nodes(cfg.rollout.node_resources)
    if not nodes:
        raise UserError(f"no alive Ray node at {cfg.runtime.ray_address} holds rollout.node_resources "
                        f"{dict(cfg.rollout.node_resources)}")
    log(f"images: {len(task_images(tasks))} image(s) on {len(nodes)} sandbox node(s)")
    task = ray.remote(num_cpus=0, max_retries=0)(prepare_node)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
        cfg, source, tasks, progress=False): n for n in nodes}
    results = []
    with tqdm(total=len(refs), unit="node", desc="nodes", disable=None) as bar:
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            node = refs[done[0]]
            try:
                results.append({**ray.get(done[0]), "node": f"{node['NodeManagerAddress']} {node['NodeID'][:8]}"})
            except Exception as e:  # noqa: BLE001  (the node's task died, or its engine did not answer)
                results.append({"node": f"{node['NodeManagerAddress']} {node['NodeID'][:8]}", "engine": "?",
                                "images": 0, "present": [], "pulled": {}, "evicted": [], "scrubbed": 0,
                                "failed": {"*": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"}})
            bar.update(1)
    return results


def cmd_pull(args) -> int:
    """``sao images pull``: exit 0 when every sandbox node has every selected image, else 1."""
    cfg = args.cfg
    tasks, _errors = tasks_from_config(cfg)
    results = pull_everywhere(cfg, cfg.tasks.source, tasks)
    for r in results:
        print(summary_line(r))
        for image, why in r["failed"].items():
            print(f"  {image}: {why}")
    return 1 if any(r["failed"] for r in results) else 0
