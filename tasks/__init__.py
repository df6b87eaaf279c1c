"""sao-harness: tasks — SWE task rows, their images, and the grading that decides the reward.

Rooms, top to bottom (each imports only the ones below it; `pyproject.toml`'s import-linter contracts):

    cli.py        `sao tasks list|show|check|build`
    preflight.py  which selected tasks can run and be graded here, and why the others cannot
    grading/      the reward: the official swebench verdict and the guarded one (grade), the clean run
                  of the graded tests (clean_run, grade_sandbox), what a patch changed (applied,
                  diffparse, guard), the grader's own tests (canary, variants, perturb), the verdict
                  (grade_status), reward-hacking probes (hacks)
    images/       task images: built offline (build), there on every node (prepare), history scrub
                  policy (scrub)
    formats/      dataset rows -> swebench 5.x rows: loaders, per-dataset adapters, test specs, eval
                  scripts (evalscript)
    model.py      the Task: one validated swebench 5.x row

Beside them: config.py (the `tasks` and `grading` sections). The bundled tasks are package data in
bundled/; suite/ generates them and is not installed.
"""
