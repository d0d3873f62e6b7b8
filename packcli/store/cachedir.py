"""The tokenization cache as a folder: which entries it holds, which are in use, and pruning them.

The cache root holds entries (``KEY/``, a token store: see ``packcli.store.tokens``; a run's, or a *part*
of one input, from which runs' entries are assembled: see ``packcli.store.parts``), one lock file per entry
(``KEY.lock``), the inputs' hash memo (``input-hashes.json``) and the temporary directories of runs
making an entry (``.tmp-HOST-PID-*``). A run that uses an entry, found or made, holds a shared
``flock`` on its lock file from before it looks the entry up until it has written its output;
pruning takes the lock exclusively without waiting, so an entry in use is never removed: it is
reported as in use and kept. Pruning also forgets the remembered hashes of files that are gone. Lock
files are removed only by the holder of the exclusive lock, and a run that locks one checks that its
path still names the file it locked (as ``safety.OutputLock``).

Earlier versions kept in-memory inputs (library lists and datasets) under ``inputs/``; they are listed
and pruned like entries (kind ``input``), and none is made any more.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packcli.errors import UsageError
from packcli.io.fingerprint import forget_missing
from packcli.jsontypes import JSONObject
from packcli.owned import HASH_MEMO, clean_stale_cache_dirs, owner_tag
from packcli.results import DamagedResult, StoreMeta, TokenizerIdentity

KEY_RE = re.compile(r"^[0-9a-f]{32}$")
LEGACY_INPUTS = "inputs"
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str, what: str) -> int:
    """``10GB`` -> 10,000,000,000 bytes (KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB of 1024).

    ``what`` is the option (``cache_max_size``) or the words (``$PACKCLI_CACHE_MAX_SIZE``) that gave it.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in SIZE_UNITS:
        problem = f"takes a size such as 500MB, 10GB or 2GiB, not '{text}'"
        raise UsageError(problem, option=what) if what.isidentifier() else UsageError(f"{what} {problem}")
    return int(float(match.group(1)) * SIZE_UNITS[unit])


def parse_age(text: str, what: str) -> float:
    """``7d`` -> seconds (s, m, h, d, w)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", str(text).lower())
    if match is None:
        raise UsageError(f"{what} takes an age such as 30m, 12h, 7d or 2w, not '{text}'")
    return float(match.group(1)) * AGE_UNITS[match.group(2)]


def allow_open_files() -> None:
    """Raise this process's soft limit of open files to its hard limit: a run holds a lock (an open
    file) on every cache part it uses, thousands for a large input, and soft limits are often 1,024."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def lock_file(root: Path, key: str) -> Path:
    """The lock file of the entry ``key``."""
    return root / f"{key}.lock"


class EntryLock:
    """A shared lock on one cache entry, held by a run while it uses the entry (see the module's doc)."""

    def __init__(self, root: Path, key: str) -> None:
        self.path = lock_file(root, key)
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the shared lock (waiting while a prune removes the entry); False when the cache's folder
        cannot hold a lock file (read-only, not a directory): the run goes on, and nothing can prune there."""
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except OSError:
                same = False
            if not same:  # removed by a prune between our open and our lock: lock the new file
                os.close(fd)
                continue
            self._fd = fd
            return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextlib.contextmanager
def _exclusive(root: Path, key: str, create: bool = True) -> Any:
    """Yield True with the entry's lock held exclusively (no run uses it), False when a run holds it."""
    path = lock_file(root, key)
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        yield True  # no lock file: no run has used the entry since it was pruned or made by an older version
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            yield False
            return
        yield True
    finally:
        os.close(fd)


@dataclass
class Entry:
    """One entry of the cache, as ``packcli cache ls`` shows it."""

    key: str  # the folder's name (``inputs/NAME`` for an in-memory input kept by an earlier version)
    kind: str  # tokens | part (one input's records, packcli.store.parts) | input
    bytes: int
    created: float  # unix time
    last_used: float  # unix time: made, or last found by a run
    in_use: bool
    tokenizer: str | None = None
    template: str | None = None
    inputs: list[str] = field(default_factory=list)
    packcli_version: str | None = None
    damaged: bool = False

    def to_json(self, now: float) -> JSONObject:
        return {**asdict(self), "age_seconds": round(max(now - self.last_used, 0.0), 1)}


def _template_words(tokenizer: TokenizerIdentity) -> str | None:
    """The template an entry was made with, and where it came from: ``deepseek (default)``."""
    name, source = tokenizer.get("chat_template"), tokenizer.get("chat_template_source")
    if name is None:  # an entry made before the template was named: the source held a path or a kind
        return source
    return f"{name} ({source})"


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(directory, name))
                # A token file an entry shares with the parts it was assembled from (a hard link) counts
                # a share in each: the cache's total is the bytes it holds on disk.
                total += st.st_size // max(st.st_nlink, 1)
    return total


def _in_use(root: Path, key: str) -> bool:
    try:
        with _exclusive(root, key, create=False) as free:
            return not free
    except OSError:
        return False


def list_entries(root: Path) -> list[Entry]:
    """Every entry of the cache at ``root``, least recently used first."""
    entries: list[Entry] = []
    if not root.is_dir():
        return entries
    for path in root.iterdir():
        if KEY_RE.match(path.name) and path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                entries.append(_token_entry(root, path))
    legacy = root / LEGACY_INPUTS
    if legacy.is_dir() and not legacy.is_symlink():
        for path in legacy.iterdir():
            with contextlib.suppress(OSError):
                st = path.lstat()
                entries.append(
                    Entry(f"{LEGACY_INPUTS}/{path.name}", "input", _size(path), st.st_mtime, st.st_mtime, False)
                )
    return sorted(entries, key=lambda e: (e.last_used, e.key))


def _token_entry(root: Path, path: Path) -> Entry:
    used = path.stat().st_mtime
    try:
        meta = StoreMeta.from_dict(json.loads((path / "meta.json").read_text(encoding="utf-8")))
        made, part = meta.made, meta.part
        inputs = [str(s.path) for s in meta.sources]
        if part is not None:  # a cache part: which records of its input
            first, records = int(part["first"]), int(part["records"])
            inputs = [f"{name} (records {first:,} to {first + records - 1:,})" for name in inputs]
        return Entry(
            key=path.name,
            kind="tokens" if part is None else "part",
            bytes=_size(path),
            created=used if made is None else float(made.time),
            last_used=used,
            in_use=_in_use(root, path.name),
            tokenizer=meta.tokenizer.get("name"),
            template=_template_words(meta.tokenizer),
            inputs=inputs,
            packcli_version=None if made is None else made.packcli_version,
        )
    except (OSError, ValueError, DamagedResult, AttributeError, TypeError, KeyError):
        return Entry(path.name, "tokens", _size(path), used, used, _in_use(root, path.name), damaged=True)


def touch(entry: Path) -> None:
    """Mark an entry as used now (its folder's modification time), for pruning by age."""
    with contextlib.suppress(OSError):
        os.utime(entry)


def prune(
    root: Path,
    older_than: float | None = None,
    max_size: int | None = None,
    dry_run: bool = False,
    keep: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Remove entries last used more than ``older_than`` seconds ago, then the least recently used ones
    until the cache holds at most ``max_size`` bytes. Never an entry a run holds, nor those in ``keep``.

    Return what was (with ``dry_run``: would be) removed, what was kept because it is in use, and the
    bytes before and after.
    """
    now = time.time()
    entries = list_entries(root)
    total = sum(e.bytes for e in entries)
    left = total
    removed: list[Entry] = []
    in_use: list[str] = []
    for entry in entries:  # least recently used first
        too_old = older_than is not None and now - entry.last_used > older_than
        too_big = max_size is not None and left > max_size
        if not (too_old or too_big) or entry.key in keep:
            continue
        if _remove(root, entry, dry_run):
            removed.append(entry)
            left -= entry.bytes
        else:
            in_use.append(entry.key)
    if not dry_run:
        clean_stale_cache_dirs(root)
        _remove_orphan_locks(root)
        if (root / HASH_MEMO).is_file():
            forget_missing(root / HASH_MEMO)
    return {
        "removed": [e.to_json(now) for e in removed],
        "in_use": in_use,
        "bytes_before": total,
        "bytes_after": left,
        "bytes_freed": total - left,
        "dry_run": dry_run,
    }


def _remove(root: Path, entry: Entry, dry_run: bool) -> bool:
    """Remove one entry unless a run holds it; return whether it was (or, dry, would be) removed."""
    path = root / entry.key
    if entry.kind == "input":
        if not dry_run:
            _rmtree_aside(path)
        return True
    with _exclusive(root, entry.key, create=not dry_run) as free:
        if not free:
            return False
        if not dry_run:
            _rmtree_aside(path)
            with contextlib.suppress(OSError):
                lock_file(root, entry.key).unlink()  # under the exclusive lock (see EntryLock.acquire)
        return True


def _rmtree_aside(path: Path) -> None:
    """Move ``path`` aside under a temporary name first: it is gone at once, never half there."""
    if path.is_dir() and not path.is_symlink():
        aside = Path(tempfile.mkdtemp(prefix=f".tmp-{owner_tag()}-prune-", dir=path.parent))
        os.replace(path, aside / "entry")
        shutil.rmtree(aside, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remove_orphan_locks(root: Path) -> None:
    """Remove the lock files of entries that are gone (none held)."""
    with contextlib.suppress(OSError):
        for path in root.glob("*.lock"):
            key = path.name.removesuffix(".lock")
            if KEY_RE.match(key) and not (root / key).exists():
                with contextlib.suppress(OSError), _exclusive(root, key, create=False) as free:
                    if free and not (root / key).exists():
                        path.unlink()
