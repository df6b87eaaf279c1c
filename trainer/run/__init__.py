"""The loop and its actors.

`sao train`'s TrainRun, the engine replicas, rollout workers, the trace queue, weight publication, rank
actors, Ray.
"""
