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
import threading
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


class HashingCancelled(Exception):
    """The hash being taken was no longer wanted (``Memo.fingerprint_and_count``'s ``cancelled``)."""


def _hash_file(
    path: str | Path, count_lines: bool, chunk_size: int = CHUNK, cancelled: threading.Event | None = None
) -> tuple[str, int | None]:
    """The content hash of one file (``file_blake2b``) and, with ``count_lines``, its lines that are not
    blank (a JSON lines file's records, as ``io.readers.count_records`` counts them), in the same read.
    ``cancelled`` set: HashingCancelled at the next chunk."""
    file_hash = hashlib.blake2b(digest_size=16)
    lines = blank = 0
    open_blank = True  # whether the line not yet ended is blank so far
    with open_uri(str(path)) if is_uri(str(path)) else open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            file_hash.update(chunk)
            raise_if_stopped()  # may run in a thread beside the tokenizer's loading
            if cancelled is not None and cancelled.is_set():
                raise HashingCancelled(str(path))
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
    """The files whose hash ``fingerprint`` would compute (not remembered, or changed since), in order
    (``Memo.files_to_hash``, with the memo at ``memo_path``, if any)."""
    return Memo.load(memo_path).files_to_hash(sources)


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

    For one source; a run asks a ``Memo`` it reads once for all of its inputs.
    """
    return fingerprint_and_count(source, memo_path, known, remember, count=False)[0]


def fingerprint_and_count(
    source: InputSource,
    memo_path: Path | None = None,
    known: dict[str, str] | None = None,
    remember: bool = True,
    count: bool = True,
) -> tuple[str, int | None]:
    """Return a source's content hash and records (``Memo.fingerprint_and_count``), with the memo at
    ``memo_path``, if any, read for this source and written unless ``remember`` is False."""
    memo = Memo.load(memo_path)
    found = memo.fingerprint_and_count(source, known, count)
    if remember:
        memo.save()
    return found


@dataclass(frozen=True)
class Learned:
    """What the run's one read of a local file learned of it, for the memo: ``taken`` (its hash, its
    records, and its stamp from before that read), its record format and its cache parts' ends (the
    layout they were cut by, and the ends), if any."""

    source: InputSource
    taken: tuple[str, int | None, list[int]]  # records None: not known (the read was cut by --limit)
    fmt: str | None
    part_ends: tuple[str, list[str]] | None = None


@dataclass(frozen=True)
class Remembered:
    """What the memo remembers of a local file while its stamp is the one remembered (``Memo.remembered``):
    its hash and records, its record formats by the fields they were sniffed with, and its cache parts'
    ends by the layout they were cut by (these only with its hash)."""

    blake2b: str | None
    records: int | None  # None: not counted, or no hash remembered
    formats: dict[str, str]
    part_ends: dict[str, list[str]]

    @property
    def hashed(self) -> tuple[str, int | None] | None:
        """Its hash and records, or None: not known without reading the file."""
        return (self.blake2b, self.records) if self.blake2b is not None else None


class Memo:
    """The hash memo of a run: read once (``load``), asked of each input, and what the run learned
    written once a step (``save``), not once an input.

    The memo maps a local file's resolved path to its stamp and what was learned of it as it was then:
    its hash (``blake2b``), its records, its record formats by the fields sniffed with, and its cache
    parts' ends by layout. Labelled sources (streams copied to files of random names), URIs, Hub and
    saved datasets' own entries are not kept. Without a path (the cache off), it remembers nothing.
    """

    def __init__(self, path: Path | None, entries: JSONObject) -> None:
        self.path = path
        self._entries = entries
        # What this run changed, by path: the new entry, or None for one dropped (``save`` writes these
        # over what another run may have written meanwhile).
        self._changes: dict[str, JSONObject | None] = {}
        self._mark = False  # make the memo when it is missing, though nothing changed: it marks the cache's folder

    @classmethod
    def load(cls, path: Path | None) -> Memo:
        """The memo at ``path`` (None: no memo), read now."""
        return cls(path, _read_memo(path))

    def _set(self, key: str, entry: JSONObject | None) -> None:
        if entry is None:
            if self._entries.pop(key, None) is not None:
                self._changes[key] = None
        else:
            self._entries[key] = self._changes[key] = entry

    def _kept(self, source: InputSource) -> bool:
        """Whether the memo may hold ``source``'s files: a local file or saved dataset, not a stream's copy."""
        return self.path is not None and source.label is None and source.kind != "hub" and not is_uri(source.path)

    def files_to_hash(self, sources: list[InputSource]) -> list[str]:
        """The files whose hash ``fingerprint_and_count`` would compute (not remembered, or changed since),
        in order.

        An engine that hashes them elsewhere passes the hashes back to ``fingerprint_and_count`` as ``known``.
        """
        out: list[str] = []
        for source in sources:
            if source.kind == "hub":
                continue
            if is_uri(source.path):  # no stamp to remember a hash by: hashed every run
                out.append(source.path)
                continue
            memo = self._entries if self._kept(source) else {}
            for f in _files_of(source):
                if memo.get(str(f.resolve()), {}).get("stat") != _stamp(f.stat()):
                    out.append(str(f))
        return out

    def fingerprint_and_count(
        self,
        source: InputSource,
        known: dict[str, str] | None = None,
        count: bool = True,
        cancelled: threading.Event | None = None,
    ) -> tuple[str, int | None]:
        """Return a source's content hash (``fingerprint``) and, for a JSON lines file, its records, counted in
        the read that hashes it and remembered with its hash (None when neither the memo nor that read gave
        them). The hashes computed are remembered here, and written by ``save``.

        With ``count`` False, a remembered hash without a count is used as it is (the file is not read for it).
        ``cancelled`` set: HashingCancelled at the next 4 MiB read (a run that failed before it needed the hash).
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
        # A stream, copied to a file of a random name: not remembered (the copy is gone after the run).
        kept = self._kept(source)
        memo = self._entries if kept else {}
        self._mark = self._mark or kept
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
                    digest, lines = _hash_file(f, count_lines=counts, cancelled=cancelled)
                    entry = {"stat": stamp, "blake2b": digest, **({"records": lines} if counts else {})}
                if kept:
                    self._set(key, entry if time.time_ns() - max(stamp[1], stamp[3]) > RACY_NS else None)
            digests.append((f.name, entry["blake2b"]))
            records = entry.get("records")
        if source.kind != "saved_dataset":
            return digests[0][1], records
        for name, digest in digests:
            h.update(name.encode() + b"\0" + digest.encode())
        return h.hexdigest(), None

    def _entry_now(self, source: InputSource) -> JSONObject | None:
        """The entry of a local file (not a saved dataset) while its stamp is the one remembered, or None."""
        if not self._kept(source) or source.kind == "saved_dataset":
            return None
        entry = self._entries.get(str(Path(source.path).resolve()))
        try:
            return entry if entry is not None and entry.get("stat") == _stamp(Path(source.path).stat()) else None
        except OSError:
            return None

    def remembered(self, source: InputSource) -> Remembered | None:
        """What the memo remembers of a local file as it is now (its stamp), asked once a run for each input
        (``Remembered``), or None: nothing is known of it without reading it."""
        entry = self._entry_now(source)
        if entry is None:
            return None
        digest, records = entry.get("blake2b"), entry.get("records")
        formats = {k: v for k, v in entry.get("formats", {}).items() if isinstance(v, str)}
        ends = entry.get("part_ends", {}) if isinstance(digest, str) else {}
        return Remembered(
            digest if isinstance(digest, str) else None,
            records if isinstance(records, int) and isinstance(digest, str) else None,
            formats,
            {k: v for k, v in ends.items() if isinstance(v, list) and all(isinstance(e, str) for e in v)},
        )

    def remember_formats(self, sources: list[InputSource], fields: str, formats: dict[str, str | None]) -> None:
        """Remember each local file's record format (``formats``, by display name) with its hash, for the
        fields ``fields``: a later run that finds the file unchanged does not read it to sniff the format."""
        for source in sources:
            fmt = formats.get(source.display)
            if fmt is None or not self._kept(source) or source.kind == "saved_dataset":
                continue
            key = str(Path(source.path).resolve())
            entry = self._entries.get(key)
            if entry is None or entry.get("stat") != _stamp(Path(source.path).stat()):
                continue  # not remembered (changed in the last seconds, or the hash came from elsewhere)
            if entry.get("formats", {}).get(fields) != fmt:
                self._set(key, {**entry, "formats": {**entry.get("formats", {}), fields: fmt}})

    def remember_reads(self, learned: list[Learned], fields: str) -> None:
        """Remember what the run's reads learned of local files (``Learned``), the formats as sniffed with the
        fields ``fields``; as ``fingerprint_and_count`` does, not for a file changed in the last seconds (the
        memo is still made by ``save``: it also marks the cache's folder)."""
        if self.path is None:
            return
        self._mark = True
        now = time.time_ns()
        for one in learned:
            digest, records, stamp = one.taken
            if one.source.label is not None or is_uri(one.source.path) or now - max(stamp[1], stamp[3]) <= RACY_NS:
                continue
            entry: JSONObject = {"stat": stamp, "blake2b": digest, "records": records}
            if one.fmt is not None:
                entry["formats"] = {fields: one.fmt}
            if one.part_ends is not None:
                entry["part_ends"] = {one.part_ends[0]: one.part_ends[1]}
            self._set(str(Path(one.source.path).resolve()), entry)

    def save(self) -> None:
        """Write what the run changed since it was last saved, in one write: over the memo as it is now, so
        that what another run wrote meanwhile is kept (an entry both changed is this run's). The memo is
        made, though nothing changed, when a hash was asked of it or reads were remembered (it marks the
        cache's folder)."""
        if self.path is None or not (self._changes or (self._mark and not self.path.exists())):
            return
        memo = _read_memo(self.path) if self._changes else {}
        for key, entry in self._changes.items():
            if entry is None:
                memo.pop(key, None)
            else:
                memo[key] = entry
        _write_memo(self.path, memo)
        self._changes.clear()


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
    stamped_ns: int | None = None,
) -> str | None:
    """The first source whose content is not what was hashed before the run, or None.

    A local file is compared by its stamp (``before``, taken at ``stamped_ns``) and then by its hash: a
    write within one clock tick may keep the stamp. A file whose stamp is unchanged and had settled when
    it was taken (its mtime and ctime more than ``RACY_NS`` before ``stamped_ns``: a later write would
    have moved its ctime) is not hashed again, as the memo trusts a settled stamp for the key; its hash
    is still compared when it is ``known`` (taken as it was read, or by an engine).
    """
    known = known or {}
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
            if _settled(now, stamped_ns) and not any(path in known for path in now):
                continue
        try:
            if fingerprint(source, None, known) != expected:
                return source.display
        except OSError:
            return source.display
    return None


def _settled(now: dict[str, list[int]], stamped_ns: int | None) -> bool:
    """Whether the stamps ``now`` had settled when taken at ``stamped_ns``: their mtime and ctime more than
    ``RACY_NS`` earlier (a later write would have moved the ctime)."""
    return stamped_ns is not None and all(stamped_ns - max(stamp[1], stamp[3]) > RACY_NS for stamp in now.values())


def settled_unchanged(source: InputSource, before: dict[str, list[int]], stamped_ns: int | None) -> bool:
    """Whether a local file (or saved dataset) has the stamps it had before the run (``before``, taken at
    ``stamped_ns``) and they had settled then: ``changed_input`` needs no hash of it."""
    if source.kind == "hub" or is_uri(source.path):
        return False
    try:
        now = {str(f): _stamp(f.stat()) for f in _files_of(source)}
    except OSError:
        return False
    return all(before.get(k) == v for k, v in now.items()) and _settled(now, stamped_ns)


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
