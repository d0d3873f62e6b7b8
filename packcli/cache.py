"""The on-disk store of tokenized samples, read by offset when shards are written.

A finished store is a directory holding ``input_ids.bin`` and ``labels.bin`` (every kept sample's
tokens, concatenated, little-endian int32: a token file plus a boundary index),
``samples.npz`` (per sample: sample_index, piece_index, length, trainable count, first trained position and record
position, so the plan never reads token data) and ``meta.json`` (counts, dropped records by reason,
sources). Rows are gathered from the token files by index, touching only the pages they need.
The same layout serves as the tokenization cache, keyed by everything that
changes tokens; entries are written to a temporary directory and renamed into place, so a killed run
never leaves an entry that looks complete.

``meta.json`` also records the size and sha256 of every other file of the store and a sha256 of its
own content, written at ``finish``. ``load_store`` checks all of them before a store is used, so a
damaged entry (changed bytes, a truncated or missing file, a meta.json that is not JSON or lacks a
key) is reported as ``DamagedStore`` and never read: the caller rebuilds it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packcli.errors import OutputError, PackcliError, first_line
from packcli.safety import owner_tag

CACHE_FORMAT = 5
TOKEN_DTYPE = np.dtype("<i4")
HASH_CHUNK = 1 << 20
# Every key a finished store's meta.json has; one missing means the entry is damaged.
META_KEYS = (
    "tokenizer",
    "pad_id",
    "records_read",
    "dropped",
    "sources",
    "source_starts",
    "files",
    "meta_sha256",
)
ARRAYS = ("sample_index", "piece_index", "lengths", "trainable", "first_trained", "positions")


class DamagedStore(PackcliError):
    """A store exists at the path but fails its checks; the message says which file and how."""


def file_digest(path: Path) -> str:
    """Return the sha256 of a file, read in 1 MiB chunks (memory does not grow with the file)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _meta_digest(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write_error(path: Path, exc: OSError, fix: str) -> OutputError:
    return OutputError(f"{path}: cannot write the token store ({exc.strerror or exc}); {fix}")


def default_cache_dir() -> Path:
    """Return $PACKCLI_CACHE, else $XDG_CACHE_HOME/packcli, else ~/.cache/packcli."""
    if os.environ.get("PACKCLI_CACHE"):
        return Path(os.environ["PACKCLI_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packcli"


def cache_key(parts: dict[str, Any]) -> str:
    """Return a stable hex key for everything that decides the tokens."""
    blob = json.dumps({"cache_format": CACHE_FORMAT, **parts}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


@dataclass
class TokenStore:
    """A finished store: per-sample arrays in memory, token data read by offset on demand (TokenReader)."""

    path: Path
    sample_index: np.ndarray  # int64, one per kept sample, ascending (a split record's pieces share it)
    piece_index: np.ndarray  # int32: the piece of a split record (0 for a record kept whole)
    lengths: np.ndarray  # int32
    trainable: np.ndarray  # int32: tokens with a label
    first_trained: np.ndarray  # int32: position of the first token with a label
    positions: np.ndarray  # int32: line or record number in its source
    meta: dict[str, Any]
    # int8 per sample: its sample_role (packcli.preference.ROLES); all 0 (SFT) for a store without one.
    sample_role: np.ndarray | None = None
    # Seconds by stage of the run that made the store (read, decode, tokenize, store, cpu, wall); empty
    # for a store found in the cache. Not saved.
    seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sample_role is None:
            self.sample_role = np.zeros(len(self.lengths), dtype=np.int8)

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """Offset of each sample's first token in the token files (int64)."""
        starts = np.zeros(len(self.lengths), dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=starts[1:])
        return starts

    def open_tokens(self) -> TokenReader:
        """Open the token files for reading samples by offset."""
        return TokenReader(self.path)


class TokenReader:
    """Reads samples' tokens from the token files by offset.

    Explicit reads rather than a memory map: rows gather samples from all over the files, and mapped
    pages (with the pages the kernel maps around each fault) would count in the resident set, growing
    with the data. Read pages stay in the page cache, which is not the process's memory.
    """

    def __init__(self, path: Path) -> None:
        self._ids = open(path / "input_ids.bin", "rb")  # noqa: SIM115 - closed in close()
        self._labels = open(path / "labels.bin", "rb")  # noqa: SIM115

    def gather(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return the input_ids and labels of the samples at token offsets ``starts``, concatenated."""
        total = int(lengths.sum())
        ids = np.empty(total, dtype=TOKEN_DTYPE)
        labels = np.empty(total, dtype=TOKEN_DTYPE)
        size = TOKEN_DTYPE.itemsize
        pos = 0
        for start, n in zip(starts.tolist(), lengths.tolist(), strict=True):
            for fh, out in ((self._ids, ids), (self._labels, labels)):
                view = memoryview(out[pos : pos + n]).cast("B")
                if os.preadv(fh.fileno(), [view], start * size) != n * size:
                    # Not an OSError: that would read as a disk problem, and no disk fix helps.
                    raise DamagedStore(
                        f"{fh.name}: the token file became shorter than its index while in use; run again "
                        "(a checked store is rebuilt)"
                    )
            pos += n
        return ids, labels

    def close(self) -> None:
        self._ids.close()
        self._labels.close()

    def __enter__(self) -> TokenReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TokenStoreWriter:
    """Streams tokenized batches into a temporary directory; ``finish`` moves it to its final path.

    Every failure to write (a read-only or full disk, a path that is a file) is an OutputError that
    names ``where`` and ends with ``fix``: the caller knows whether the store is the cache or scratch
    space, and which path the user gave for it.
    """

    def __init__(self, final_path: Path, fix: str = "free disk space", where: Path | None = None) -> None:
        self.final_path = final_path
        self.fix = fix
        self.where = where or final_path.parent
        self._ids: Any = None
        self._labels: Any = None
        self.tmp: Path | None = None
        try:
            if final_path.parent.exists() and not final_path.parent.is_dir():
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            final_path.parent.mkdir(parents=True, exist_ok=True)
            # The host and PID in the name let a later run remove it once this process is gone.
            self.tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{owner_tag()}-", dir=final_path.parent))
            self._ids = open(self.tmp / "input_ids.bin", "wb")  # noqa: SIM115 - closed in finish/abort
            self._labels = open(self.tmp / "labels.bin", "wb")  # noqa: SIM115
        except OSError as exc:
            self.abort()
            raise _write_error(self.where, exc, fix) from exc
        self._arrays: dict[str, list[np.ndarray]] = {k: [] for k in ARRAYS}
        self._roles: list[np.ndarray] = []

    def add(
        self,
        sample_index: np.ndarray,
        lengths: np.ndarray,
        ids: np.ndarray,
        labels: np.ndarray,
        trainable: np.ndarray,
        first_trained: np.ndarray,
        positions: np.ndarray,
        piece_index: np.ndarray | None = None,
        sample_role: np.ndarray | None = None,
    ) -> None:
        if len(lengths) == 0:
            return
        if sample_role is not None or self._roles:
            # Preference data: every sample's role is stored (a store without roles is all SFT).
            self._roles.append(np.zeros(len(lengths), np.int8) if sample_role is None else sample_role)
            if len(self._roles) == 1 and self._arrays["lengths"]:
                self._roles.insert(0, np.zeros(sum(map(len, self._arrays["lengths"])), np.int8))
        try:
            self._ids.write(np.ascontiguousarray(ids, dtype=TOKEN_DTYPE).tobytes())
            self._labels.write(np.ascontiguousarray(labels, dtype=TOKEN_DTYPE).tobytes())
        except OSError as exc:
            raise _write_error(self.where, exc, self.fix) from exc
        for key, value in (
            ("sample_index", sample_index),
            ("piece_index", np.zeros(len(lengths), np.int32) if piece_index is None else piece_index),
            ("lengths", lengths),
            ("trainable", trainable),
            ("first_trained", first_trained),
            ("positions", positions),
        ):
            self._arrays[key].append(value)

    def finish(self, meta: dict[str, Any]) -> TokenStore:
        """Close the files, record their checksums, move the store into place and return it."""
        assert self.tmp is not None
        try:
            self._ids.close()
            self._labels.close()
            arrays = {
                k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64 if k == "sample_index" else np.int32))
                for k, v in self._arrays.items()
            }
            if self._roles:
                arrays["sample_role"] = np.concatenate(self._roles)
            np.savez(self.tmp / "samples.npz", **arrays)
            files = sorted(p.name for p in self.tmp.iterdir() if p.is_file())
            meta = {
                **meta,
                "files": {
                    name: {"bytes": (self.tmp / name).stat().st_size, "sha256": file_digest(self.tmp / name)}
                    for name in files
                },
            }
            meta["meta_sha256"] = _meta_digest(meta)
            # Written last: a store without a whole meta.json fails its check and is rebuilt.
            (self.tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
            if self.final_path.is_dir() and not self.final_path.is_symlink():
                shutil.rmtree(self.final_path, ignore_errors=True)
            elif self.final_path.exists() or self.final_path.is_symlink():
                self.final_path.unlink()
            try:
                os.replace(self.tmp, self.final_path)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not self.final_path.is_dir():
                    raise
                # Another run finished the same entry in between: the same key, the same content.
                # Theirs is used, and checked like any entry.
                shutil.rmtree(self.tmp, ignore_errors=True)
        except OSError as exc:
            raise _write_error(self.where, exc, self.fix) from exc
        return load_store(self.final_path)

    def abort(self) -> None:
        for fh in (self._ids, self._labels):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def check_store(path: Path) -> dict[str, Any]:
    """Check a store's meta.json and the size and sha256 of each of its files; return the meta.

    Raise DamagedStore naming the first problem. The cost is one sequential read of the store.
    """
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        raise DamagedStore(f"{path}: meta.json is missing") from None
    except (OSError, ValueError) as exc:
        raise DamagedStore(f"{path}: meta.json cannot be read ({first_line(exc)})") from exc
    if not isinstance(meta, dict):
        raise DamagedStore(f"{path}: meta.json is not a JSON object")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise DamagedStore(f"{path}: meta.json lacks {', '.join(missing)}")
    if meta["meta_sha256"] != _meta_digest(meta):
        raise DamagedStore(f"{path}: meta.json does not match its checksum")
    files = meta["files"]
    if not isinstance(files, dict) or not {"input_ids.bin", "labels.bin", "samples.npz"} <= set(files):
        raise DamagedStore(f"{path}: meta.json does not list the store's files")
    for name, expect in sorted(files.items()):
        file = path / name
        try:
            size = file.stat().st_size
            if size != expect["bytes"]:
                raise DamagedStore(f"{file}: has {size} bytes, meta.json says {expect['bytes']}")
            if file_digest(file) != expect["sha256"]:
                raise DamagedStore(f"{file}: sha256 differs from meta.json (changed bytes)")
        except FileNotFoundError:
            raise DamagedStore(f"{file}: is missing") from None
        except OSError as exc:
            raise DamagedStore(f"{file}: cannot be read ({exc.strerror or exc})") from exc
    return meta


def load_store(path: Path, verify: bool = True) -> TokenStore:
    """Load a finished store's per-sample arrays and metadata, checked first unless ``verify`` is False."""
    meta = check_store(path) if verify else json.loads((path / "meta.json").read_text())
    try:
        with np.load(path / "samples.npz") as data:
            arrays = {k: data[k] for k in ARRAYS}
            if "sample_role" in data:
                arrays["sample_role"] = data["sample_role"]
    except (OSError, ValueError, KeyError) as exc:
        raise DamagedStore(f"{path / 'samples.npz'}: cannot be read ({first_line(exc)})") from exc
    return TokenStore(path=path, meta=meta, **arrays)


def find_store(path: Path) -> TokenStore | None:
    """Return the checked store at ``path``, or None when there is none.

    Raise DamagedStore when something is there but fails the checks: it must be rebuilt, not used.
    """
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir():
        raise DamagedStore(f"{path}: is not a directory")
    return load_store(path)
