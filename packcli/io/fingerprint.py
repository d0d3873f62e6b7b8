"""The content hashes of the inputs: what the tokenization cache is keyed by and the manifest records.

A file's hash is remembered in a memo by its stat stamp (size, mtime, inode, ctime), as git's index
does, so an unchanged input is not read again; ``changed_input`` tells whether an input changed during
a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packcli.io.sources import InputSource
from packcli.io.uri import is_uri, open_uri
from packcli.jsontypes import JSONObject
from packcli.procs.stop import raise_if_stopped


def file_blake2b(path: str | Path) -> str:
    """The content hash of one file, a local path or a URI (blake2b, 16 bytes), read in 4 MiB chunks."""
    return _hash_file(path, count_lines=False)[0]


# A newline followed by a line of nothing but whitespace (bytes.strip's): one match per blank line after
# the first. (Led by a literal newline, the search runs at the speed of bytes.count.)
_BLANK_AFTER = re.compile(rb"\n(?=[ \t\r\f\v]*\n)")
CHUNK = 1 << 22


def _hash_file(path: str | Path, count_lines: bool, chunk_size: int = CHUNK) -> tuple[str, int | None]:
    """The content hash of one file (``file_blake2b``) and, with ``count_lines``, its lines that are not
    blank (a JSON lines file's records, as ``io.readers.count_records`` counts them), in the same read."""
    file_hash = hashlib.blake2b(digest_size=16)
    lines = blank = 0
    open_blank = True  # whether the line not yet ended is blank so far
    with open_uri(str(path)) if is_uri(str(path)) else open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            file_hash.update(chunk)
            raise_if_stopped()  # may run in a thread beside the tokenizer's loading
            if not count_lines:
                continue
            first, last = chunk.find(b"\n"), chunk.rfind(b"\n")
            if first < 0:
                open_blank = open_blank and not chunk.strip()
                continue
            blank += open_blank and not chunk[:first].strip()  # the line begun in an earlier chunk
            lines += chunk.count(b"\n", first, last + 1)
            blank += len(_BLANK_AFTER.findall(chunk, first, last + 1))  # the lines ended in this chunk
            open_blank = not chunk[last + 1 :].strip()
    if not open_blank:  # a last line without a newline
        lines += 1
    return file_hash.hexdigest(), (lines - blank if count_lines else None)


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
    return fingerprint_and_count(source, memo_path, known, remember, count=False)[0]


def fingerprint_and_count(
    source: InputSource,
    memo_path: Path | None = None,
    known: dict[str, str] | None = None,
    remember: bool = True,
    count: bool = True,
) -> tuple[str, int | None]:
    """Return a source's content hash (``fingerprint``) and, for a JSON lines file, its records, counted in the
    read that hashes it and remembered with its hash (None when neither the memo nor that read gave them).

    With ``count`` False, a remembered hash without a count is used as it is (the file is not read for it).
    """
    h = hashlib.blake2b(digest_size=16)
    if source.kind == "hub":
        h.update(f"hub:{source.path}:{source.split}".encode())
        return h.hexdigest(), None
    known = known or {}
    counts = count and source.kind == "jsonl" and source.compression is None
    if is_uri(source.path):
        return known.get(source.path) or file_blake2b(source.path), None
    files = _files_of(source)
    if source.label is not None:
        # A stream, copied to a file of a random name: not remembered (the copy is gone after the run).
        memo_path = None
    memo = _read_memo(memo_path)
    changed = False
    digests = []
    records = None
    for f in files:
        key = str(f.resolve())
        stamp = _stamp(f.stat())
        entry = memo.get(key, {})
        if entry.get("stat") != stamp or (counts and "records" not in entry and str(f) not in known):
            if str(f) in known:
                entry = {"stat": stamp, "blake2b": known[str(f)]}
            else:
                digest, lines = _hash_file(f, count_lines=counts)
                entry = {"stat": stamp, "blake2b": digest, **({"records": lines} if counts else {})}
            if time.time_ns() - max(stamp[1], stamp[3]) > RACY_NS:
                memo[key] = entry
                changed = True
            else:
                changed = memo.pop(key, None) is not None or changed
        digests.append((f.name, entry["blake2b"]))
        records = entry.get("records")
    if remember and memo_path is not None and (changed or not memo_path.exists()):  # it also marks the cache's folder
        _write_memo(memo_path, memo)
    if source.kind != "saved_dataset":
        return digests[0][1], records
    for name, digest in digests:
        h.update(name.encode() + b"\0" + digest.encode())
    return h.hexdigest(), None


def remembered_hash(source: InputSource, memo_path: Path | None) -> tuple[str, int | None] | None:
    """A local file's hash and records as the memo remembers them for its stamp now, or None: not known
    without reading it."""
    if memo_path is None or source.label is not None or source.kind in ("hub", "saved_dataset") or is_uri(source.path):
        return None
    entry = _read_memo(memo_path).get(str(Path(source.path).resolve()), {})
    try:
        if entry.get("stat") != _stamp(Path(source.path).stat()) or not isinstance(entry.get("blake2b"), str):
            return None
    except OSError:
        return None
    records = entry.get("records")
    return entry["blake2b"], records if isinstance(records, int) else None


def remembered_part_ends(source: InputSource, memo_path: Path | None, layout: str) -> list[str] | None:
    """The ends of a JSON lines file's cache parts cut by ``layout``, as the memo remembers them for its
    stamp now (``remember_read``), or None."""
    if remembered_hash(source, memo_path) is None:
        return None
    entry = _read_memo(memo_path).get(str(Path(source.path).resolve()), {})
    ends = entry.get("part_ends", {}).get(layout)
    return ends if isinstance(ends, list) and all(isinstance(e, str) for e in ends) else None


@dataclass(frozen=True)
class Learned:
    """What the run's one read of a local file learned of it, for the memo: ``taken`` (its hash, its
    records, and its stamp from before that read), its record format and its cache parts' ends (the
    layout they were cut by, and the ends), if any."""

    source: InputSource
    taken: tuple[str, int | None, list[int]]  # records None: not known (the read was cut by --limit)
    fmt: str | None
    part_ends: tuple[str, list[str]] | None = None


def remember_reads(learned: list[Learned], memo_path: Path | None, fields: str) -> None:
    """Remember what the run's reads learned of local files (``Learned``), the formats as sniffed with the
    fields ``fields``, in one write of the memo; as ``fingerprint`` does, not for a file changed in the
    last seconds (the memo is still made: it also marks the cache's folder)."""
    if memo_path is None:
        return
    memo = _read_memo(memo_path)
    now, changed = time.time_ns(), False
    for one in learned:
        digest, records, stamp = one.taken
        if one.source.label is not None or is_uri(one.source.path) or now - max(stamp[1], stamp[3]) <= RACY_NS:
            continue
        entry: JSONObject = {"stat": stamp, "blake2b": digest, "records": records}
        if one.fmt is not None:
            entry["formats"] = {fields: one.fmt}
        if one.part_ends is not None:
            entry["part_ends"] = {one.part_ends[0]: one.part_ends[1]}
        memo[str(Path(one.source.path).resolve())] = entry
        changed = True
    if changed or not memo_path.exists():
        _write_memo(memo_path, memo)


def remembered_format(source: InputSource, memo_path: Path | None, fields: str) -> str | None:
    """The record format remembered for a JSON lines file as it is now (its stamp), sniffed with the fields
    ``fields`` (a key of the fields asked for), or None: it must be sniffed."""
    if memo_path is None or source.label is not None or source.kind != "jsonl" or is_uri(source.path):
        return None
    entry = _read_memo(memo_path).get(str(Path(source.path).resolve()), {})
    try:
        stamp = _stamp(Path(source.path).stat())
    except OSError:
        return None
    found = entry.get("formats", {}).get(fields) if entry.get("stat") == stamp else None
    return found if isinstance(found, str) else None


def remember_formats(
    sources: list[InputSource], memo_path: Path | None, fields: str, formats: dict[str, str | None]
) -> None:
    """Remember each JSON lines file's record format (``formats``, by display name) with its hash, for the
    fields ``fields``: a later run that finds the file unchanged does not read it to sniff the format."""
    if memo_path is None:
        return
    memo = _read_memo(memo_path)
    changed = False
    for source in sources:
        fmt = formats.get(source.display)
        if fmt is None or source.label is not None or source.kind != "jsonl" or is_uri(source.path):
            continue
        entry = memo.get(str(Path(source.path).resolve()))
        if entry is None or entry.get("stat") != _stamp(Path(source.path).stat()):
            continue  # not remembered (changed in the last seconds, or the hash came from elsewhere)
        if entry.setdefault("formats", {}).get(fields) != fmt:
            entry["formats"][fields] = fmt
            changed = True
    if changed:
        _write_memo(memo_path, memo)


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
