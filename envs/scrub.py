"""Scrub the future out of a sandbox's repository: nothing newer than ``base_commit`` is left to read.

A published task image often keeps its repository's later history (the fix included) in branches,
tags, remote refs, the stash, notes, reflogs, dangling objects or an alternate object store; a policy
that runs ``git log --all`` copies the fix. ``scrub_history(sandbox, base_commit)`` runs ``SCRIPT``
in the container (one ``bash`` exec, as the sandbox's user). Contract, with ``B = base_commit``:

- refs: every ref whose commit is not an ancestor-or-equal of ``B`` is deleted (``for-each-ref
  --merged B`` keeps the rest: old tags stay, so ``git describe`` / setuptools-scm still work), and
  so are every ``refs/replace/*`` and any ref naming a non-commit; ``packed-refs`` goes through the
  same ``update-ref --stdin`` transaction. Reflogs (the stash's entries too), ``ORIG_HEAD``,
  ``FETCH_HEAD`` and the other pseudo-refs and state files (merge / rebase / bisect / sequencer
  state, commit messages, rr-cache, lost-found, info/grafts, info/refs) are removed; so are other
  worktrees, with their checkouts.
- objects: ``pack-objects --revs --all --indexed-objects`` writes what the kept refs, HEAD and the
  index reach into one new pack (existing deltas reused, no delta search, no fsync); then everything
  else under ``objects/`` (old packs, loose objects, commit-graph, multi-pack-index, alternates) is
  deleted, and the alternate object stores themselves. ``.git/shallow`` keeps the commits still there.
- kept: HEAD (which must be ``B`` or an ancestor of it), the index, the working tree.
- cost: one object walk and one pack write, about ``git repack -a -d`` alone (``git gc --prune=now``
  and ``repack`` + ``prune`` walk more than once); ``rev-list --objects | pack-objects`` overlaps two
  processes but costs more CPU, and a sandbox has ``sandbox.cpus``. ``bench/bench_scrub.py``.

Any failure is ``ScrubError`` (a ``SandboxError``: the episode is an infra error, never a reward).

Once per image and node: ``scrubbed_image(client, image, base_commit, sandbox_cfg, docker_cfg)`` runs the
scrub in a throwaway container of ``image`` (no network, the sandbox's user and limits) and commits it as
``sao-scrubbed:<key>``, ``key = sha256(image id, base_commit, repo, SCRIPT)``; every later sandbox of that
task on this node starts from the committed image and scrubs nothing. The overlay hides the source
layers' files (whiteouts), so the old packs are not readable from it. A cached image is used only when
its labels name that source image id and that key (a tag alone is not trusted); it is recorded in
``envs.pull``'s use record, so ``docker.image_cache_bytes`` evicts it like a fetched image.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from sao_harness.envs.config import DockerConfig, SandboxConfig
from sao_harness.envs.errors import SandboxError
from sao_harness.envs.labels import OWNER_KEY, OWNER_VALUE
from sao_harness.envs.pull import _locked, evict, record_path, touch

SCRIPT = r"""
set -euo pipefail
die() { echo "scrub: $*" >&2; exit 3; }
holds() { case "$2/" in "${1%/}"/*) return 0;; esac; return 1; }  # is $2 the directory $1 or inside it
base_rev=$1; repo=$2
cd "$repo" 2>/dev/null || die "no directory $repo"
export GIT_NO_REPLACE_OBJECTS=1 LC_ALL=C
top=$(git rev-parse --show-toplevel 2>&1) || die "no git work tree at $repo: $top"
top=$(cd "$top" && pwd -P)
gitdir=$(cd "$(git rev-parse --absolute-git-dir)" && pwd -P)
common=$(cd "$(git rev-parse --git-common-dir)" && pwd -P)
[ "$gitdir" = "$common" ] || die "$repo is a linked worktree of $common: scrub its main worktree"
base=$(git rev-parse -q --verify "$base_rev^{commit}") || die "base_commit $base_rev is not a commit of $repo"
head=$(git rev-parse -q --verify 'HEAD^{commit}') || die "HEAD of $repo names no commit"
git merge-base --is-ancestor "$head" "$base" || die "HEAD $head is not base_commit $base nor an ancestor of it"
objects=$common/objects
tmp=$common/sao-scrub.$$
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp"

# other worktrees: their admin dirs and their checkouts
for admin in "$common"/worktrees/*/; do
  [ -d "$admin" ] || continue
  if [ -f "$admin/gitdir" ]; then
    wt=$(dirname "$(cat "$admin/gitdir")")
    if holds "$wt" "$top" || holds "$wt" "$common"; then die "worktree $wt holds $top"; fi
    rm -rf "$wt"
  fi
  rm -rf "$admin"
done

# refs: keep the ancestors-or-equal of base (replace refs never); delete the rest in one transaction
git for-each-ref --format='%(refname)' | sort > "$tmp/all"
git for-each-ref --format='%(refname)' --merged "$base" | sed '/^refs\/replace\//d' | sort > "$tmp/keep"
comm -23 "$tmp/all" "$tmp/keep" | sed 's/^/delete /' > "$tmp/delete"
git update-ref --no-deref --stdin < "$tmp/delete"
git for-each-ref --format='%(refname)' | sort | cmp -s - "$tmp/keep" || die "refs left after deleting them"

# reflogs (the stash's entries too), pseudo-refs, and state that can name or hold later commits
rm -rf "$common"/logs "$common"/*_HEAD "$common"/*MSG "$common"/BISECT_* "$common"/MERGE_* "$common"/AUTO_MERGE \
  "$common"/rebase-merge "$common"/rebase-apply "$common"/sequencer "$common"/rr-cache "$common"/lost-found \
  "$common"/info/grafts "$common"/info/refs "$common"/gc.log

# objects: what the kept refs, HEAD and the index reach, into one new pack; everything else goes
{ if [ -f "$objects/info/alternates" ]; then cat "$objects/info/alternates"; fi
  printf '%s\n' "${GIT_ALTERNATE_OBJECT_DIRECTORIES:-}" | tr ':' '\n'; } > "$tmp/alternates"
pack=$(echo HEAD | git -c core.fsync=none -c pack.writeReverseIndex=false pack-objects -q --revs --all \
  --indexed-objects --window=0 --delta-base-offset "$tmp/pack")  # deltas reused, none searched; no fsync
find "$objects" -mindepth 1 -maxdepth 1 ! -name pack -exec rm -rf {} +
find "$objects/pack" -mindepth 1 -exec rm -rf {} +
mkdir -p "$objects/info"
for ext in pack rev idx; do  # the .idx last: git finds a pack by its index
  if [ -f "$tmp/pack-$pack.$ext" ]; then mv "$tmp/pack-$pack.$ext" "$objects/pack/"; fi
done
while IFS= read -r alt; do
  case "$alt" in ''|'#'*) continue;; /*) ;; *) alt=$objects/$alt;; esac
  real=$(cd "$alt" 2>/dev/null && pwd -P) || continue
  if holds "$real" "$top" || holds "$real" "$common"; then die "alternate object store $alt holds $top"; fi
  rm -rf "$real"
  [ ! -e "$real" ] || die "cannot remove the alternate object store $real"
done < "$tmp/alternates"
if [ -f "$common/shallow" ]; then  # only the boundary commits that still exist
  git cat-file --batch-check='%(objectname) %(objecttype)' < "$common/shallow" | awk '$2 == "commit" {print $1}' \
    > "$tmp/shallow"
  if [ -s "$tmp/shallow" ]; then mv "$tmp/shallow" "$common/shallow"; else rm -f "$common/shallow"; fi
fi
echo "scrubbed refs_deleted=$(wc -l < "$tmp/delete") objects_kept=$(git count-objects -v | sed -n 's/^in-pack: //p')"
"""


class ScrubError(SandboxError):
    """The history scrub failed; the message quotes the script's error."""


@dataclass(frozen=True)
class ScrubResult:
    refs_deleted: int
    objects_kept: int
    seconds: float


def scrub_command(base_commit: str, repo: str) -> list[str]:
    """argv that scrubs ``repo`` down to ``base_commit`` (see the module doc), for any exec."""
    return ["bash", "-c", SCRIPT, "sao-scrub", base_commit, repo]


def parse_result(output: str, seconds: float) -> ScrubResult:
    """The script's last line, ``scrubbed refs_deleted=N objects_kept=M``, as a ``ScrubResult``."""
    lines = output.strip().splitlines()
    fields = dict(kv.split("=", 1) for kv in lines[-1].split()[1:]) if lines and lines[-1].startswith(
        "scrubbed ") else {}
    try:
        return ScrubResult(int(fields["refs_deleted"]), int(fields["objects_kept"]), seconds)
    except (KeyError, ValueError):
        raise ScrubError(f"history scrub: no result line in its output: {output.strip()[-300:]!r}") from None


def _exec_scrub(api, container_id: str, base_commit: str, repo: str, user: str, name: str,
                timeout_s: float) -> ScrubResult:
    """Run SCRIPT in a running container (one exec as ``user``); its result, or ``ScrubError``."""
    argv = ["timeout", "-s", "KILL", str(int(timeout_s)), *scrub_command(base_commit, repo)]
    t0 = time.monotonic()
    try:
        ex = api.exec_create(container_id, argv, stdout=True, stderr=True, user=user, workdir=repo)
        out = api.exec_start(ex["Id"]).decode(errors="replace")
        code = api.exec_inspect(ex["Id"]).get("ExitCode")
    except Exception as e:  # noqa: BLE001  (docker-py / engine trouble: an infra error of the episode)
        raise ScrubError(f"history scrub of {repo} in {name}: {type(e).__name__}: {e}") from None
    seconds = time.monotonic() - t0
    if code != 0:
        why = "timed out" if code == 137 else f"exit {code}"
        raise ScrubError(f"history scrub of {repo} to {base_commit} in {name} failed ({why}): {out.strip()[-500:]}")
    return parse_result(out, seconds)


def scrub_history(sandbox, base_commit: str, repo: str | None = None, timeout_s: float = 300.0) -> ScrubResult:
    """Scrub ``repo`` (default: the sandbox's workdir) in ``sandbox`` (an ``envs.sandbox.Sandbox``)."""
    repo = repo or sandbox.workdir
    return _exec_scrub(sandbox.api, sandbox.container_id, base_commit, repo, sandbox.cfg.user or "",
                       f"sandbox {sandbox.name}", timeout_s)


# -- once per image and node: the scrubbed image ------------------------------------------------------
SCRUBBED_REPOSITORY = "sao-scrubbed"
SOURCE_LABEL = "sao-harness.scrubbed-from"  # the source image's id
KEY_LABEL = "sao-harness.scrub-key"


def scrub_key(image_id: str, base_commit: str, repo: str) -> str:
    """The cache key: sha256 of the source image id, base_commit, the repository path and SCRIPT (first 24 hex)."""
    return hashlib.sha256("\0".join([image_id, base_commit, repo, SCRIPT]).encode()).hexdigest()[:24]


def _cached(client, tag: str, image_id: str, key: str) -> bool:
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    try:
        labels = client.api.inspect_image(tag)["Config"].get("Labels") or {}
    except docker.errors.ImageNotFound:
        return False
    return labels.get(SOURCE_LABEL) == image_id and labels.get(KEY_LABEL) == key


def scrubbed_image(client, image: str, base_commit: str, cfg: SandboxConfig, docker_cfg: DockerConfig, *,
                   timeout_s: float = 300.0) -> tuple[str, ScrubResult | None]:
    """(tag, result): ``image`` with ``cfg.workdir`` scrubbed to ``base_commit``, made on a miss (module doc).

    ``result`` is None when the cached image was used. A failure is ``ScrubError``; the source image is
    never changed.
    """
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    repo = cfg.workdir
    try:
        src = client.api.inspect_image(image)
    except docker.errors.ImageNotFound:
        raise ScrubError(f"history scrub: no image {image} on this engine") from None
    key = scrub_key(src["Id"], base_commit, repo)
    tag = f"{SCRUBBED_REPOSITORY}:{key}"
    uses = record_path(client, docker_cfg)
    if not _cached(client, tag, src["Id"], key):
        with _locked(uses.with_name(f"scrub-{key}")):  # concurrent workers of this node: one scrub per image
            if not _cached(client, tag, src["Id"], key):
                result = _scrub_and_commit(client, image, src, base_commit, cfg, tag, key, timeout_s)
                touch(uses, tag, source=f"scrub of {image}")
                evict(client, docker_cfg, keep={tag, image})
                return tag, result
    touch(uses, tag)
    return tag, None


def _scrub_and_commit(client, image: str, src: dict, base_commit: str, cfg: SandboxConfig, tag: str, key: str,
                      timeout_s: float) -> ScrubResult:
    """Scrub in a container of ``image`` that removes itself (``timeout_s`` at most), then commit it as ``tag``.

    The committed config is the source image's (entrypoint, command, user, labels) plus the two scrub
    labels: nothing of this container (its keep-alive command, its labels) carries over.
    """
    import docker  # lazy: docker-py is heavy (it pulls in requests)

    name = f"sao-scrub-{key[:12]}-{time.monotonic_ns() % 10**6}"
    conf = src.get("Config") or {}
    labels = {**(conf.get("Labels") or {}), SOURCE_LABEL: src["Id"], KEY_LABEL: key}
    try:
        box = client.containers.run(
            image, entrypoint=["sleep", str(int(timeout_s) + 60)], command=[], name=name, detach=True,
            auto_remove=True, network_mode="none", mem_limit=cfg.memory, memswap_limit=cfg.memory,
            nano_cpus=int(cfg.cpus * 1e9), pids_limit=cfg.pids_limit, security_opt=["no-new-privileges"],
            cap_drop=["ALL"], cap_add=cfg.cap_add or None, working_dir=cfg.workdir,
            labels={OWNER_KEY: OWNER_VALUE}, **({"user": cfg.user} if cfg.user else {}))
    except docker.errors.APIError as e:
        raise ScrubError(f"history scrub of {image}: cannot start its container: {e.explanation or e}") from None
    try:
        result = _exec_scrub(client.api, box.id, base_commit, cfg.workdir, cfg.user or "",
                             f"a container of {image}", timeout_s)
        try:
            client.api.commit(box.id, repository=SCRUBBED_REPOSITORY, tag=key, conf={
                "Entrypoint": conf.get("Entrypoint"), "Cmd": conf.get("Cmd"), "User": conf.get("User") or "",
                "WorkingDir": conf.get("WorkingDir") or "", "Env": conf.get("Env"), "Labels": labels},
                message=f"sao-harness: {image} with its history after {base_commit} scrubbed")
        except docker.errors.APIError as e:
            raise ScrubError(f"history scrub of {image}: cannot commit it: {e.explanation or e}") from None
    finally:
        try:
            box.remove(force=True)
        except docker.errors.APIError:  # already gone (auto_remove)
            pass
    return result

