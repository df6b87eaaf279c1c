"""Minimal-edit expert traces: a task's gold patch as the shortest ``file_editor`` calls that apply it.

- ``minimal_edits(text, patched_file)``: for each changed region of one file's diff (a run of
  removed/added lines; runs at most ``MERGE_GAP`` unchanged lines apart make one region), an
  ``(old_str, new_str)`` pair whose ``old_str`` is the region's removed lines grown by the fewest
  context lines (then the fewest characters) that make it occur exactly once in the file as it is
  when the edit runs (earlier edits applied); a trailing newline common to both is dropped when the rest is
  still unique. With ``strips`` (the prompt tool format: the SDK strips every parameter value) an edit
  also does the same with both strings stripped (it grows context until it does).
  None when the diff does not match ``text`` (the caller falls back).
- ``expert_replies(task, read_file, strips=)``: the assistant replies (``Reply``) of an expert episode: the
  edits (one ``str_replace`` per region, ``create`` for new files, ``rm`` for deleted ones), then ``finish``.
  ``read_file(image, path)`` gives a file of the task's image (None if it cannot); a file it cannot
  read, or whose diff does not match it, gets the scripted gold policy's hunk-wide edits.
- ``image_file_reader(docker_cfg)``: a ``read_file`` that reads from the image through a created
  (never started) container and the archive API.
"""
from __future__ import annotations

import io
import tarfile

from unidiff import PatchSet

from sao_harness.harness.engines.scripted_policy import REPO, Reply, call, patch_to_tool_calls

FINISH_MESSAGE = "Done."
# Changed runs this close (unchanged lines between) are one edit: repeating a few lines in old_str and
# new_str costs fewer tokens than another turn (its call and the editor's ~8-line snippet observation).
MERGE_GAP = 3


def _regions(patched_file, merge_gap: int = 0) -> list[tuple[int, list[str], list[str]]]:
    """``(0-based line in the original file, removed lines, added lines)`` per changed region: a run of
    changed lines; two runs of a hunk at most ``merge_gap`` unchanged lines apart are one region."""
    out = []
    for hunk in patched_file:
        src = hunk.source_start - 1 if hunk.source_length else hunk.source_start  # @@ -N,0: insert after line N
        cur, gap = None, []
        for line in hunk:
            if line.is_context:
                gap.append(line.value)
                src += 1
                continue
            if cur is not None and len(gap) <= merge_gap:  # close to the previous run: the same region
                cur[1].extend(gap)
                cur[2].extend(gap)
            elif cur is None or gap:
                cur = (src, [], [])
                out.append(cur)
            gap = []
            if line.is_removed:
                cur[1].append(line.value)
                src += 1
            elif line.is_added:
                cur[2].append(line.value)
    return out


def _lines(text: str) -> list[str]:
    """``text`` split after each ``\n`` only (as a diff splits it)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _unique_at(text: str, needle: str, pos: int) -> bool:
    return bool(needle) and text.find(needle) == pos and text.find(needle, pos + 1) == -1


def _survives_strip(text: str, old: str, new: str, pos: int) -> bool:
    """Whether replacing ``old`` (at ``pos``) by ``new`` does the same with both stripped (unique once stripped)."""
    so, sn = old.strip(), new.strip()
    at = text.find(so)
    return (bool(so) and at >= 0 and text.find(so, at + 1) == -1
            and text[:at] + sn + text[at + len(so):] == text[:pos] + new + text[pos + len(old):])


def _shortest_unique(lines: list[str], i: int, j: int, added: list[str], strips: bool):
    """The fewest context lines around ``lines[i:j]`` (then the fewest characters) that make it unique (and,
    with ``strips``, an edit to ``added`` that survives stripping): ``(a, b, old, new, pos, text)`` with
    ``old = text[pos:pos+len(old)] = "".join(lines[a:b])``, or None."""
    text = "".join(lines)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    for k in range(len(lines) + 1):  # k context lines in all, split before / after every way
        best = None
        for before in range(k + 1):
            a, b = i - before, j + k - before
            if a < 0 or b > len(lines):
                continue
            old, new = text[starts[a]:starts[b]], "".join(lines[a:i] + added + lines[j:b])
            if (_unique_at(text, old, starts[a]) and (not strips or _survives_strip(text, old, new, starts[a]))
                    and (best is None or len(old) < len(best[2]))):
                best = (a, b, old, new, starts[a], text)
        if best is not None:
            return best
    return None


def minimal_edits(text: str, patched_file, merge_gap: int = MERGE_GAP,
                  strips: bool = False) -> list[tuple[str, str]] | None:
    """The ``(old_str, new_str)`` pairs that turn ``text`` into the patched file (see the module doc)."""
    lines = _lines(text)
    for hunk in patched_file:  # every hunk's old side (context and removed lines) must be in the file
        start = hunk.source_start - 1 if hunk.source_length else hunk.source_start
        if lines[start:start + hunk.source_length] != [ln.value for ln in hunk if not ln.is_added]:
            return None
    edits, delta = [], 0
    for start, removed, added in _regions(patched_file, merge_gap):
        i = start + delta
        if i < 0 or i > len(lines) or lines[i:i + len(removed)] != removed:
            return None
        j = i + len(removed)
        found = _shortest_unique(lines, i, j, added, strips)
        if found is None:
            return None
        a, b, old, new, pos, current = found
        if (old.endswith("\n") and new.endswith("\n") and _unique_at(current, old[:-1], pos)
                and (not strips or _survives_strip(current, old[:-1], new[:-1], pos))):
            edits.append((old[:-1], new[:-1]))
        else:
            edits.append((old, new))
        lines[a:b] = _lines(new)
        delta += len(added) - len(removed)
    return edits


def expert_replies(task, read_file=None, repo: str = REPO, strips: bool = False) -> list[Reply]:
    """The expert episode's assistant replies for ``task``: minimal edits of its gold patch, then finish."""
    replies = []
    for pf in PatchSet(task.patch):
        path = f"{repo}/{pf.path}"
        if pf.is_added_file or pf.is_removed_file:
            replies += patch_to_tool_calls(str(pf), repo)
            continue
        text = read_file(task.image, path) if read_file is not None and task.image else None
        edits = minimal_edits(text, pf, strips=strips) if text is not None else None
        if edits is None:  # unreadable file, or a diff that does not match it: the hunk-wide edits
            replies += patch_to_tool_calls(str(pf), repo)
            continue
        replies += [call("file_editor", {"command": "str_replace", "path": path, "old_str": old,
                                         "new_str": new}) for old, new in edits]
    return replies + [call("finish", {"message": FINISH_MESSAGE})]


def image_file_reader(docker_cfg=None):
    """``read_file(image, path) -> str | None``: the file at ``path`` in ``image`` (None if absent/unreadable)."""
    from sao_harness.envs.engine import docker_client  # lazy: docker-py is heavy
    from sao_harness.envs.labels import run_labels  # lazy: next to docker_client

    def read_file(image: str, path: str) -> str | None:
        client = docker_client(docker_cfg)
        try:
            cid = client.api.create_container(image, command=["true"], network_disabled=True,
                                              labels=run_labels(**{"sao-harness.kind": "expert-read"}))["Id"]
        except Exception:  # noqa: BLE001  (no image, no engine: the caller falls back)
            return None
        try:
            stream, _ = client.api.get_archive(cid, path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.next()
                f = tar.extractfile(member) if member is not None and member.isfile() else None
                return f.read().decode("utf-8") if f is not None else None
        except Exception:  # noqa: BLE001
            return None
        finally:
            try:
                client.api.remove_container(cid, force=True)
            except Exception:  # noqa: BLE001
                pass

    return read_file
