"""The task feed's routing of episodes to engine replicas (no Ray: the actor's own class)."""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from sao_harness.trainer.run.actors import TaskFeed

Feed = TaskFeed.__ray_actor_class__  # the plain class behind the Ray actor


def _feed(replicas=("r0", "r1")):
    feed = Feed([SimpleNamespace(instance_id=f"t{i}") for i in range(3)], seed=0, mode="async", group_size=1,
                groups_per_round=1, session="s")
    for name in replicas:
        feed.add_replica(name, engine=None, url=f"http://127.0.0.1:1/{name}", node_ip="127.0.0.1")
    return feed


def test_episodes_go_to_the_least_loaded_replica():
    feed = _feed()
    first = [feed.next(f"w{i}")["route"]["replica"] for i in range(4)]  # four workers, none done yet
    assert Counter(first) == {"r0": 2, "r1": 2}
    feed.remove_replica("r1")
    assert feed.next("w0")["route"]["replica"] == "r0"  # a dead replica gets nothing


def test_a_lone_worker_alternates_between_idle_replicas():
    """Ties take turns: one fast worker (the others not started yet) must not pin every episode to r0."""
    feed = _feed()
    seen = [feed.next("w0")["route"]["replica"] for _ in range(6)]
    assert Counter(seen) == {"r0": 3, "r1": 3}


def test_a_replica_only_on_loopback_is_unreachable_from_another_node():
    feed = _feed(("r0",))
    assert "unreachable" in feed.next("w0", node_ip="127.0.0.2")
