"""The on-disk store of tokenized samples: an Arrow IPC file, memory-mapped when shards are written.

A finished store is a directory holding ``tokens.arrow`` (one row per kept sample: ``sample_index``,
``input_ids``, ``labels``), ``samples.npz`` (per-sample lengths, trainable counts, first trained
position and record position, so the plan never reads token data) and ``meta.json`` (counts, dropped
records by reason, sources). The same layout serves as the tokenization cache, keyed by everything that
changes tokens; entries are written to a temporary directory and renamed into place, so a killed run
never leaves an entry that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

CACHE_FORMAT = 1
TOKENS_SCHEMA = pa.schema(
    [
        ("sample_index", pa.int64()),
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
    ]
)


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
    """A finished store: per-sample arrays in memory, token data memory-mapped on demand."""

    path: Path
    sample_index: np.ndarray  # int64, one per kept sample, ascending
    lengths: np.ndarray  # int32
    trainable: np.ndarray  # int32: tokens with a label
    first_trained: np.ndarray  # int32: position of the first token with a label
    positions: np.ndarray  # int32: line or record number in its source
    meta: dict[str, Any]

    def open_tokens(self) -> TokenReader:
        """Memory-map the token table."""
        return TokenReader(self.path / "tokens.arrow")


class TokenReader:
    """The token table, memory-mapped; ``release`` drops the pages read so far from this process.

    Pages of a mapped file count in the resident set while mapped; releasing them after each shard
    keeps peak memory at one shard's worth whatever the size of the data (they stay in the page cache).
    """

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self.table = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(self._map))).read_all()

    def release(self) -> None:
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.table = None
        try:
            self._map.close()
        except BufferError:  # arrays still point into the map; the OS frees it at exit
            pass
        self._file.close()

    def __enter__(self) -> TokenReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TokenStoreWriter:
    """Streams tokenized batches into a temporary directory; ``finish`` moves it to its final path."""

    def __init__(self, final_path: Path) -> None:
        self.final_path = final_path
        final_path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final_path.parent))
        self._sink = pa.OSFile(str(self.tmp / "tokens.arrow"), "wb")
        self._writer = pa.ipc.new_file(self._sink, TOKENS_SCHEMA)
        self._arrays: dict[str, list[np.ndarray]] = {
            k: [] for k in ("sample_index", "lengths", "trainable", "first_trained", "positions")
        }

    def add(
        self,
        sample_index: np.ndarray,
        lengths: np.ndarray,
        ids: np.ndarray,
        labels: np.ndarray,
        trainable: np.ndarray,
        first_trained: np.ndarray,
        positions: np.ndarray,
    ) -> None:
        if len(lengths) == 0:
            return
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        batch = pa.record_batch(
            [
                pa.array(sample_index, pa.int64()),
                pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, pa.int32())),
                pa.ListArray.from_arrays(pa.array(offsets), pa.array(labels, pa.int32())),
            ],
            schema=TOKENS_SCHEMA,
        )
        self._writer.write_batch(batch)
        for key, value in (
            ("sample_index", sample_index),
            ("lengths", lengths),
            ("trainable", trainable),
            ("first_trained", first_trained),
            ("positions", positions),
        ):
            self._arrays[key].append(value)

    def finish(self, meta: dict[str, Any]) -> TokenStore:
        """Close the files, move the store into place and return it."""
        self._writer.close()
        self._sink.close()
        arrays = {
            k: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64 if k == "sample_index" else np.int32))
            for k, v in self._arrays.items()
        }
        np.savez(self.tmp / "samples.npz", **arrays)
        (self.tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        if self.final_path.exists():
            shutil.rmtree(self.final_path, ignore_errors=True)
        os.replace(self.tmp, self.final_path)
        return load_store(self.final_path)

    def abort(self) -> None:
        try:
            self._writer.close()
            self._sink.close()
        except Exception:  # closing a half-written file may fail; it is deleted anyway
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def load_store(path: Path) -> TokenStore:
    """Load a finished store's per-sample arrays and metadata."""
    with np.load(path / "samples.npz") as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads((path / "meta.json").read_text())
    return TokenStore(path=path, meta=meta, **arrays)


def find_store(path: Path) -> TokenStore | None:
    """Return the finished store at ``path``, or None when there is none (or it is unreadable)."""
    if not (path / "meta.json").is_file():
        return None
    try:
        return load_store(path)
    except (OSError, ValueError, KeyError):
        return None
