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
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from envs.errors import SandboxError

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


def scrub_history(sandbox, base_commit: str, repo: str | None = None, timeout_s: float = 300.0) -> ScrubResult:
    """Scrub ``repo`` (default: the sandbox's workdir) in ``sandbox`` (an ``envs.sandbox.Sandbox``)."""
    repo = repo or sandbox.workdir
    argv = ["timeout", "-s", "KILL", str(int(timeout_s)), *scrub_command(base_commit, repo)]
    t0 = time.monotonic()
    try:
        ex = sandbox.api.exec_create(sandbox.container_id, argv, stdout=True, stderr=True,
                                     user=sandbox.cfg.user or "", workdir=repo)
        out = sandbox.api.exec_start(ex["Id"]).decode(errors="replace")
        code = sandbox.api.exec_inspect(ex["Id"]).get("ExitCode")
    except Exception as e:  # noqa: BLE001  (docker-py / engine trouble: an infra error of the episode)
        raise ScrubError(f"history scrub of {repo} in sandbox {sandbox.name}: {type(e).__name__}: {e}") from None
    seconds = time.monotonic() - t0
    if code != 0:
        why = "timed out" if code == 137 else f"exit {code}"
        raise ScrubError(f"history scrub of {repo} to {base_commit} in sandbox {sandbox.name} failed ({why}): "
                         f"{out.strip()[-500:]}")
    return parse_result(out, seconds)
