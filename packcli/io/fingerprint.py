"""The content hashes of the inputs: what the tokenization cache is keyed by and the manifest records.

A file's hash is remembered in a memo by its stat stamp (size, mtime, inode, ctime), as git's index
does, so an unchanged input is not read again; ``changed_input`` tells whether an input changed during
a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from packcli.io.sources import InputSource
from packcli.io.uri import is_uri, open_uri
from packcli.procs.stop import raise_if_stopped


def file_blake2b(path: str | Path) -> str:
    """The content hash of one file, a local path or a URI (blake2b, 16 bytes), read in 4 MiB chunks."""
    file_hash = hashlib.blake2b(digest_size=16)
    with open_uri(str(path)) if is_uri(str(path)) else open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            file_hash.update(chunk)
            raise_if_stopped()  # may run in a thread beside the tokenizer's loading
    return file_hash.hexdigest()


def _files_of(source: InputSource) -> list[Path]:
    if source.kind == "saved_dataset":
        return sorted(p for p in Path(source.path).iterdir() if p.is_file())
    return [Path(source.path)]


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def file_stamp(path: str | os.PathLike[str]) -> list[int]:
    """Return a file's stamp: size, mtime, inode and ctime (a copy that restores size and mtime still changes it)."""
    return _stamp(os.stat(path))


def files_to_hash(sources: list[InputSource], memo_path: Path | None = None) -> list[str]:
    """The files whose hash ``fingerprint`` would compute (not remembered, or changed since), in order.

    An engine that hashes them elsewhere passes the hashes back to ``fingerprint`` as ``known``.
    """
    out: list[str] = []
    for source in sources:
        if source.kind == "hub":
            continue
        if is_uri(source.path):  # no stamp to remember a hash by: hashed every run
            out.append(source.path)
            continue
        memo = _read_memo(None if source.label is not None else memo_path)
        for f in _files_of(source):
            key = str(f.resolve())
            if memo.get(key, {}).get("stat") != _stamp(f.stat()):
                out.append(str(f))
    return out


def fingerprint(
    source: InputSource, memo_path: Path | None = None, known: dict[str, str] | None = None, remember: bool = True
) -> str:
    """Return the content hash of a source, for the tokenization cache and the manifest.

    Of the content only, never of a path or name: a file's hash is the BLAKE2b (16 bytes) of its bytes
    (``b2sum -l 128``), whatever it is called and wherever it is; a saved dataset's is of its files'
    names inside it and their hashes; a Hub dataset's is of its name and split.
    ``known`` maps files to hashes already computed (by an engine, elsewhere: see ``files_to_hash``).
    With ``memo_path``, a file's hash is remembered with its size, modification time, inode and status
    change time (ctime), and not computed again while all four stay the same (as git's index does).
    ctime cannot be set back by a program (utime restores mtime only), so an edit in place that
    restores size, mtime and inode still changes the stamp. A file changed in the last seconds is not
    remembered (a later write in the same clock tick could keep its stamp). ``remember`` False reads the
    memo but never writes it (a dry run writes nothing).
    """
    h = hashlib.blake2b(digest_size=16)
    if source.kind == "hub":
        h.update(f"hub:{source.path}:{source.split}".encode())
        return h.hexdigest()
    known = known or {}
    if is_uri(source.path):
        return known.get(source.path) or file_blake2b(source.path)
    files = _files_of(source)
    if source.label is not None:
        # A stream, copied to a file of a random name: not remembered (the copy is gone after the run).
        memo_path = None
    memo = _read_memo(memo_path)
    changed = False
    digests = []
    for f in files:
        key = str(f.resolve())
        stamp = _stamp(f.stat())
        if memo.get(key, {}).get("stat") != stamp:
            digest = known.get(str(f)) or file_blake2b(f)
            if time.time_ns() - max(stamp[1], stamp[3]) > RACY_NS:
                memo[key] = {"stat": stamp, "blake2b": digest}
                changed = True
            else:
                changed = memo.pop(key, None) is not None or changed
        else:
            digest = memo[key]["blake2b"]
        digests.append((f.name, digest))
    if remember and memo_path is not None and (changed or not memo_path.exists()):  # it also marks the cache's folder
        _write_memo(memo_path, memo)
    if source.kind != "saved_dataset":
        return digests[0][1]
    for name, digest in digests:
        h.update(name.encode() + b"\0" + digest.encode())
    return h.hexdigest()


# A file whose mtime or ctime is this recent is hashed again next run rather than remembered.
RACY_NS = 2_000_000_000


def stamps(sources: list[InputSource]) -> dict[str, list[int]]:
    """The stamps (size, mtime, inode, ctime) of the sources' local files, taken before they are hashed."""
    out: dict[str, list[int]] = {}
    for source in sources:
        if source.kind == "hub" or is_uri(source.path):
            continue
        for f in _files_of(source):
            out[str(f)] = _stamp(f.stat())
    return out


def changed_input(
    sources: list[InputSource],
    before: dict[str, list[int]],
    fingerprints: list[str],
    known: dict[str, str] | None = None,
) -> str | None:
    """The first source whose content is not what was hashed before the run, or None.

    A local file is compared by its stamp (``before``) and then hashed again: a write within one
    clock tick may keep the stamp. ``known`` holds hashes computed elsewhere (an engine's).
    """
    for source, expected in zip(sources, fingerprints, strict=True):
        if source.kind == "hub":
            continue
        if not is_uri(source.path):
            try:
                now = {str(f): _stamp(f.stat()) for f in _files_of(source)}
            except OSError:
                return source.display
            if now != {k: v for k, v in before.items() if k in now} or not set(now) <= set(before):
                return source.display
        try:
            if fingerprint(source, None, known) != expected:
                return source.display
        except OSError:
            return source.display
    return None


def _read_memo(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        memo = json.loads(path.read_text())
        return memo if isinstance(memo, dict) else {}
    except (OSError, ValueError):
        return {}


def forget_missing(memo_path: Path) -> None:
    """Drop the remembered hashes of files that no longer exist (``packcli cache prune``)."""
    memo = _read_memo(memo_path)
    kept = {k: v for k, v in memo.items() if os.path.exists(k)}
    if len(kept) != len(memo):
        _write_memo(memo_path, kept)


def _write_memo(path: Path, memo: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, path)
    except OSError:  # the memo only saves time; without it, files are hashed again
        pass
