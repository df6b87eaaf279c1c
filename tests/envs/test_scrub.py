"""The history scrub (envs.scrub, tasks.scrub): nothing after base_commit is left for the agent to read.

- On a host repository with later history of every kind a published image keeps (branches, an
  annotated tag, tags of a tree and a blob, remote refs and a symbolic one, packed refs, the stash,
  notes, a replace ref, reflogs, ORIG_HEAD / FETCH_HEAD, .git/shallow, a linked worktree, an
  alternate object store, objects packed that only later commits reach, a dangling commit, a loose
  blob): every leak is seen before the scrub and none after, while the base tree, the index and the
  working tree (uncommitted setup changes) are kept. The same check on scripts with one step
  removed finds a leak each time: the test's power.
- Docker: an image with later history, started by ``run_episode``: the "agent" finds nothing of the
  future with ``git log --all``, ``git show``, ``git cat-file --batch-all-objects``; a base commit
  the image lacks is an infra error, never a reward; the project's verified build of a bundled task
  is spared, an image built FROM it (labels inherited) is not.
"""
from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from sao_harness.envs.scrub import SCRIPT, ScrubError, parse_result
from sao_harness.harness.trace import Status

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@localhost", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
SECRETS = ("FIXSECRET", "LATERSECRET", "TAGSECRET", "BLOBSECRET", "NOTESECRET", "STASHSECRET", "DANGLINGSECRET",
           "LOOSESECRET", "ALTSECRET")


def git(repo: Path, *args: str, check: bool = True, no_replace: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, **ENV, **({"GIT_NO_REPLACE_OBJECTS": "1"} if no_replace else {})}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, errors="replace",
                          check=check)


def out(repo: Path, *args: str, **kw) -> str:
    return git(repo, *args, **kw).stdout


def commit(repo: Path, path: str, text: str, message: str) -> str:
    (repo / path).write_text(text)
    git(repo, "add", path)
    git(repo, "commit", "-q", "-m", message)
    return out(repo, "rev-parse", "HEAD").strip()


def hash_object(repo: Path, text: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=text, text=True,
                          capture_output=True, check=True, env={**os.environ, **ENV}).stdout.strip()


def future_repo(root: Path) -> tuple[Path, str, dict[str, str]]:
    """(repo, base commit, {kind: sha}) of a repository with later history of every kind (module doc)."""
    repo, alt = root / "repo", root / "alt.git"
    git(root, "init", "-q", "-b", "main", str(repo))
    commit(repo, "f.txt", "one\n", "c1")
    git(repo, "tag", "v0.1")
    commit(repo, "f.txt", "two\n", "c2")
    git(repo, "tag", "-a", "v0.2", "-m", "an old release")
    base = commit(repo, "f.txt", "three\n", "c3")
    git(repo, "checkout", "-q", "-b", "future")
    sha = {"fix": commit(repo, "fix.py", "FIXSECRET = 1\n", "the fix")}
    sha["later"] = commit(repo, "f.txt", "four\n", "LATERSECRET")
    git(repo, "tag", "-a", "v9", "-m", "TAGSECRET")
    sha["tag"] = out(repo, "rev-parse", "v9").strip()
    git(repo, "tag", "vtree", "HEAD^{tree}")
    sha["blob"] = hash_object(repo, "BLOBSECRET\n")
    git(repo, "tag", "vblob", sha["blob"])
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    git(repo, "symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/main")
    git(repo, "checkout", "-q", "main")
    git(repo, "worktree", "add", "-q", str(root / "wt"), "future")
    git(repo, "pack-refs", "--all")
    git(repo, "repack", "-a", "-d", "-q")  # the later objects packed alongside the base's
    git(repo, "notes", "add", "-m", "NOTESECRET", base)
    sha["notes"] = out(repo, "rev-parse", "refs/notes/commits").strip()
    (repo / "f.txt").write_text("STASHSECRET\n")
    git(repo, "stash", "-q")
    sha["stash"] = out(repo, "rev-parse", "refs/stash").strip()
    (repo / "d.txt").write_text("DANGLINGSECRET\n")
    git(repo, "add", "d.txt")
    tree = out(repo, "write-tree").strip()
    sha["dangling"] = out(repo, "commit-tree", tree, "-p", base, "-m", "dangling").strip()
    git(repo, "rm", "-q", "--cached", "d.txt")
    (repo / "d.txt").unlink()
    sha["loose"] = hash_object(repo, "LOOSESECRET\n")
    git(repo, "replace", base, sha["fix"])
    (repo / ".git/ORIG_HEAD").write_text(sha["later"] + "\n")
    (repo / ".git/FETCH_HEAD").write_text(f"{sha['later']}\t\tbranch 'future' of elsewhere\n")
    (repo / ".git/shallow").write_text(sha["fix"] + "\n")
    git(root, "init", "-q", "--bare", str(alt))
    sha["alt"] = hash_object(alt, "ALTSECRET\n")
    (repo / ".git/objects/info/alternates").write_text(f"{alt}/objects\n")
    (repo / "f.txt").write_text("three\nan uncommitted setup change\n")  # what the image ships, kept
    (repo / "setup.txt").write_text("staged by the image's setup\n")
    git(repo, "add", "setup.txt")
    return repo, base, sha


def leaks(repo: Path, base: str, sha: dict[str, str]) -> list[str]:
    """Every way the repository still shows something after ``base`` (empty: nothing)."""
    found = []
    ancestors = set(out(repo, "rev-list", base, no_replace=True).split())
    if any(s in out(repo, "log", "--all", "--format=%H %B", check=False) for s in (*SECRETS, *sha.values())):
        found.append("git log --all")
    found += [f"git show {kind}" for kind, s in sha.items() if git(repo, "show", s, check=False).returncode == 0]
    batch = out(repo, "cat-file", "--batch-all-objects", "--batch", check=False)
    found += [f"cat-file --batch-all-objects: {s}" for s in SECRETS if s in batch]
    listed = out(repo, "cat-file", "--batch-all-objects", "--batch-check", check=False).split("\n")
    found += [f"cat-file: a later commit {c.split()[0][:12]}" for c in listed if c.endswith(" commit")
              and c.split()[0] not in ancestors][:1]
    fsck = git(repo, "fsck", "--unreachable", "--no-reflogs", "--lost-found", check=False)
    if fsck.stdout.strip():
        found.append("fsck --unreachable")
    if any(p.is_file() for p in (repo / ".git/lost-found").rglob("*")):
        found.append("lost-found")
    refs = out(repo, "for-each-ref", "--format=%(refname) %(*objectname) %(objectname)").splitlines()
    found += [f"ref {r.split()[0]}" for r in refs if not set(r.split()[1:]) & ancestors]
    if out(repo, "reflog", check=False).strip() or (repo / ".git/logs").exists():
        found.append("reflog")
    found += [f"pseudo-ref {p}" for p in ("ORIG_HEAD", "FETCH_HEAD") if (repo / ".git" / p).exists()]
    if len(out(repo, "worktree", "list").splitlines()) > 1 or (repo.parent / "wt").exists():
        found.append("worktree")
    if (repo.parent / "alt.git/objects").exists() or (repo / ".git/objects/info/alternates").exists():
        found.append("alternate object store")
    raw = {s: (s.encode(), bytes.fromhex(s)) for s in sha.values()}
    for path in (repo / ".git").rglob("*"):  # any file naming a later object: text or binary (an .idx)
        data = path.read_bytes() if path.is_file() else b""
        found += [f"{path.relative_to(repo)} names {kind}" for kind, s in sha.items() if any(f in data for f in raw[s])]
    return found


def state(repo: Path, base: str) -> dict:
    """What the scrub keeps: HEAD, the base's tree and history, the index, the working tree, old tags."""
    q = dict(no_replace=True)
    return {"head": out(repo, "rev-parse", "HEAD", **q), "tree": out(repo, "rev-parse", f"{base}^{{tree}}", **q),
            "history": out(repo, "rev-list", base, **q), "status": out(repo, "status", "--porcelain", **q),
            "diff": out(repo, "diff", base, **q), "staged": out(repo, "diff", "--cached", base, **q),
            "tags": out(repo, "tag", "--merged", base, **q), "describe": out(repo, "describe", "--tags", **q)}


def run_script(repo: Path, base: str, script: str = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script, "sao-scrub", base, str(repo)], capture_output=True, text=True,
                          env={**os.environ, **ENV})


def test_the_scrub_leaves_nothing_after_base_and_keeps_the_checkout(tmp_path):
    repo, base, sha = future_repo(tmp_path)
    before = leaks(repo, base, sha)
    for kind in ("git log --all", "git show fix", "git show tag", "git show notes", "git show stash",
                 "git show dangling", "git show loose", "git show alt", "cat-file --batch-all-objects: FIXSECRET",
                 "fsck --unreachable", "ref refs/heads/future", "ref refs/tags/vblob", "ref refs/remotes/origin/HEAD",
                 "ref refs/stash", "ref refs/notes/commits", "reflog", "pseudo-ref FETCH_HEAD", "worktree",
                 "alternate object store", ".git/packed-refs names later", ".git/shallow names fix"):
        assert kind in before, (kind, before)  # each leak is there to be found: the check has power
    kept = state(repo, base)
    res = run_script(repo, base)
    assert res.returncode == 0, res.stderr
    result = parse_result(res.stdout, 0.0)
    assert result.refs_deleted == 9 and result.objects_kept > 0
    assert leaks(repo, base, sha) == []
    assert state(repo, base) == kept and kept["describe"].startswith("v0.2-1-g")  # old tags still describe
    assert out(repo, "tag").split() == ["v0.1", "v0.2"] and out(repo, "stash", "list") == ""
    assert git(repo, "fsck", "--full", "--strict").returncode == 0
    assert sorted(out(repo, "rev-list", "--all").split()) == sorted(kept["history"].split())


SABOTAGES = {  # a step of the script removed -> (the text replaced, its replacement, a leak the check must find)
    "refs kept (and not checked)": ('git update-ref --no-deref --stdin < "$tmp/delete"\n'
                                    'git for-each-ref --format=\'%(refname)\' | sort | cmp -s - "$tmp/keep" || die',
                                    "true ||", "ref refs/heads/future"),
    "reflogs kept": ('rm -rf "$common"/logs ', "rm -rf ", "reflog"),
    "old packs kept": ('find "$objects/pack" -mindepth 1 -exec rm -rf {} +\n', "", "git show fix"),
    "loose objects kept": ('find "$objects" -mindepth 1 -maxdepth 1 ! -name pack -exec rm -rf {} +\n',
                           'rm -f "$objects/info/alternates"\n', "git show dangling"),
    "alternate store kept": ('  rm -rf "$real"\n  [ ! -e "$real" ] || die', "  true || die", "alternate object store"),
    "worktrees kept": ('    rm -rf "$wt"\n', "", "worktree"),
    "shallow kept": ('if [ -f "$common/shallow" ]', "if false", ".git/shallow names fix"),
}


@pytest.mark.parametrize("name", list(SABOTAGES))
def test_a_scrub_missing_any_step_leaks(name, tmp_path):
    old, new, leak = SABOTAGES[name]
    assert old in SCRIPT, name
    repo, base, sha = future_repo(tmp_path)
    res = run_script(repo, base, SCRIPT.replace(old, new, 1))
    assert res.returncode == 0, res.stderr  # the rest of the script ran
    assert leak in leaks(repo, base, sha), name


@pytest.mark.parametrize("case, message", [
    ("unknown base", r"base_commit 0{40} is not a commit of"),
    ("head after base", r"HEAD [0-9a-f]{40} is not base_commit [0-9a-f]{40} nor an ancestor of it"),
    ("not a repo", r"no git work tree at"),
])
def test_the_scrub_refuses_what_it_cannot_make_safe(case, message, tmp_path):
    repo = tmp_path / "repo"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    base = commit(repo, "f.txt", "one\n", "c1")
    later = commit(repo, "f.txt", "two\n", "c2")
    if case == "unknown base":
        base = "0" * 40
    elif case == "not a repo":
        (repo / ".git").rename(repo / "not-git")
    res = run_script(repo, base)
    assert res.returncode == 3 and re.search(message, res.stderr), res.stderr
    if case == "head after base":
        assert out(repo, "cat-file", "-t", later) == "commit\n"  # refused before anything was deleted
    with pytest.raises(ScrubError, match="no result line"):
        parse_result(res.stdout, 0.0)


# --- Docker: the attack through run_episode, and the verified image spared -----------------------------
ATTACK_DOCKERFILE = """FROM {image}
RUN cd /testbed && git checkout -q -b future && echo 'FIXSECRET = 1' > fix.py && git add fix.py \\
 && git commit -q -m 'the fix' && git tag -a v9 -m TAGSECRET && git update-ref refs/remotes/origin/main HEAD \\
 && git rev-parse HEAD > /future && git checkout -q main && echo STASHSECRET >> README.md && git stash -q \\
 && git pack-refs --all && git repack -a -d -q
"""
BUNDLED_ID = "sao-harness__minicfg-11"


@pytest.fixture(scope="module")
def images(docker_engine):
    """(bundled task, its verified image, an image built FROM it with later history: every label inherited)."""
    from sao_harness.sao.config import load_config
    from sao_harness.tasks.formats.loaders import BUNDLED, load_tasks
    from sao_harness.tasks.images.prepare import build_repo_images

    (task,) = load_tasks("bundled", instances=[BUNDLED_ID])
    build_repo_images(load_config("configs/local.yaml"), docker_engine, BUNDLED, [task], log=lambda *_: None)
    dockerfile = ATTACK_DOCKERFILE.format(image=task.image).encode()
    attack = "sao-test/scrub-attack:1"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    buf.seek(0)
    docker_engine.images.build(fileobj=buf, custom_context=True, tag=attack, network_mode="none", rm=True,
                               forcerm=True)
    return task, task.image, attack


class NoProxy:
    base_url = "http://127.0.0.1:9/v1"  # never called: the "agent" below does not use the model

    def close_episode(self, episode_id):
        from sao_harness.harness.proxy import UnknownEpisode

        raise UnknownEpisode(episode_id)


def episode(task, run_id: str, tmp_path, agent_commands: dict[str, str], monkeypatch) -> tuple:
    """``run_episode`` of ``task`` whose "agent" runs ``agent_commands`` in the sandbox: (trajectory, outputs)."""
    import sao_harness.harness.episode as ep
    from sao_harness.sao.config import load_config

    seen: dict[str, str] = {}

    def agent(sb, **_):
        for name, cmd in agent_commands.items():
            if "@FUTURE" in cmd:  # the later commit's sha, written outside the repository by the image's build
                cmd = cmd.replace("@FUTURE", sb.read_text("/future").strip())
            seen[name] = sb.run(cmd, 60).output
        return SimpleNamespace(status=Status.OK, iterations=1, error=None, to_dict=lambda: {"status": Status.OK})

    monkeypatch.setattr(ep, "run_agent", agent)
    cfg = load_config("configs/local.yaml", [f"run.root={tmp_path}", "run.name=scrub"])
    traj = ep.run_episode(task, ep.EpisodeContext(cfg=cfg, proxy=NoProxy(), run_id=run_id, grade=False))
    return traj, seen


AGENT = {"log": "git log --all --format='%H %s'", "show": "git show @FUTURE; echo rc=$?",
         "objects": "git cat-file --batch-all-objects --batch-check",
         "contents": "git cat-file --batch-all-objects --batch | grep -c SECRET",
         "stash": "git stash list; git reflog; git tag; git branch -a"}


def test_an_agent_finds_nothing_after_base_in_a_scrubbed_sandbox(images, docker_engine, test_run_id, tmp_path,
                                                                monkeypatch):
    from sao_harness.tasks.images.scrub import history_verified

    task, _, attack = images
    attacked = dataclasses.replace(task, image=attack)  # the bundled task's id and labels, not its image
    assert docker_engine.images.get(attack).labels["sao.task"] == BUNDLED_ID
    assert not history_verified(docker_engine, attack, BUNDLED_ID)
    forget_scrubbed(docker_engine, attack)  # a copy scrubbed by an earlier run would scrub nothing here
    traj, seen = episode(attacked, test_run_id, tmp_path, AGENT, monkeypatch)
    assert traj.status == Status.OK, (traj.status, traj.metadata)
    unscrubbed = docker_engine.containers.run(attack, ["bash", "-c", "cat /future; git log --all --format=%s"],
                                              remove=True, network_mode="none").decode()
    future = unscrubbed.split()[0]
    assert "the fix" in unscrubbed  # the image does leak the fix to an unscrubbed sandbox
    history = [line.split()[0] for line in seen["log"].splitlines()]
    assert task.base_commit in history and future not in seen["log"] and "the fix" not in seen["log"]
    assert "rc=128" in seen["show"] and "bad object" in seen["show"], seen["show"]
    assert future not in seen["objects"] and seen["contents"].strip() == "0", seen
    assert "v9" not in seen["stash"] and "future" not in seen["stash"] and "stash@" not in seen["stash"], seen
    assert traj.timings["scrub_s"] < 10


def forget_scrubbed(client, image: str) -> list[str]:
    """Remove every cached scrubbed copy of ``image``; the tags removed."""
    from sao_harness.envs.scrub import SCRUBBED_REPOSITORY, SOURCE_LABEL

    source = client.images.get(image).id
    tags = [t for i in client.images.list(SCRUBBED_REPOSITORY) if i.labels.get(SOURCE_LABEL) == source for t in i.tags]
    for t in tags:
        client.images.remove(t, force=True)
    return tags


def test_the_scrubbed_image_is_made_once_per_node_and_a_forged_one_is_not_trusted(images, docker_engine, test_run_id,
                                                                                  tmp_path, monkeypatch):
    from sao_harness.envs.scrub import KEY_LABEL, SCRUBBED_REPOSITORY, SOURCE_LABEL, scrub_key

    task, _, attack = images
    attacked = dataclasses.replace(task, image=attack)
    forget_scrubbed(docker_engine, attack)
    first, seen_first = episode(attacked, test_run_id, tmp_path, AGENT, monkeypatch)
    again, seen_again = episode(attacked, test_run_id, tmp_path, AGENT, monkeypatch)
    assert first.timings["scrub_s"] > 0 and "scrub_s" not in again.timings  # the second sandbox scrubbed nothing
    assert seen_again == seen_first and "the fix" not in seen_again["log"], seen_again
    key = scrub_key(docker_engine.images.get(attack).id, task.base_commit, "/testbed")
    cached = docker_engine.images.get(f"{SCRUBBED_REPOSITORY}:{key}")
    assert cached.labels[SOURCE_LABEL] == docker_engine.images.get(attack).id and cached.labels[KEY_LABEL] == key
    assert cached.labels["sao.task"] == BUNDLED_ID and "sao-harness.run" not in cached.labels  # the source's config
    # a tag alone is not trusted: the unscrubbed image under the cache's name is scrubbed again
    forget_scrubbed(docker_engine, attack)
    docker_engine.images.get(attack).tag(SCRUBBED_REPOSITORY, key)
    forged, seen_forged = episode(attacked, test_run_id, tmp_path, AGENT, monkeypatch)
    assert forged.timings["scrub_s"] > 0 and "the fix" not in seen_forged["log"], seen_forged
    assert docker_engine.images.get(f"{SCRUBBED_REPOSITORY}:{key}").labels[KEY_LABEL] == key
    # `sao images pull` makes the copy ahead (tasks.images.scrub_images): the first sandbox scrubs nothing
    from sao_harness.sao.config import load_config
    from sao_harness.tasks.images.prepare import scrub_images

    forget_scrubbed(docker_engine, attack)
    made = scrub_images(load_config("configs/local.yaml"), docker_engine, [attacked], progress=False,
                        log=lambda *_: None)
    prepared, seen_prepared = episode(attacked, test_run_id, tmp_path, AGENT, monkeypatch)
    assert made == (1, {}) and "scrub_s" not in prepared.timings and seen_prepared == seen_first, seen_prepared


def test_a_scrub_failure_is_an_infra_error_never_a_reward(images, test_run_id, tmp_path, monkeypatch):
    task, _, attack = images
    wrong = dataclasses.replace(task, image=attack, base_commit="0" * 40)
    traj, seen = episode(wrong, test_run_id, tmp_path, AGENT, monkeypatch)
    assert (traj.status, traj.reward, seen) == (Status.INFRA_ERROR, None, {})
    why = traj.metadata[Status.INFRA_ERROR]
    assert "history scrub" in why and "is not a commit" in why


def test_the_verified_build_of_a_bundled_task_is_spared(images, docker_engine, test_run_id, tmp_path, monkeypatch):
    from sao_harness.tasks.images.scrub import history_verified, scrub_needed

    task, verified, attack = images
    traj, seen = episode(task, test_run_id, tmp_path, {"head": "git rev-parse HEAD"}, monkeypatch)
    assert traj.status == Status.OK, traj.metadata
    assert "scrub_s" not in traj.timings and seen["head"].strip() == task.base_commit
    assert history_verified(docker_engine, verified, BUNDLED_ID)
    assert not scrub_needed("auto", docker_engine, verified, BUNDLED_ID)
    assert scrub_needed("always", docker_engine, verified, BUNDLED_ID)
    assert not history_verified(docker_engine, verified, "sao-harness__minicfg-8")  # another task's image
    assert scrub_needed("auto", docker_engine, attack, BUNDLED_ID) and not scrub_needed("never", docker_engine,
                                                                                         attack, BUNDLED_ID)
