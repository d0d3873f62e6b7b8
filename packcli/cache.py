"""The on-disk store of tokenized samples, read by offset when shards are written.

A finished store is a directory holding ``input_ids.bin`` and ``labels.bin`` (every kept sample's
tokens, concatenated, little-endian int32: a token file plus a boundary index),
``samples.npz`` (per sample: sample_index, length, trainable count, first trained position and record
position, so the plan never reads token data) and ``meta.json`` (counts, dropped records by reason,
sources). Rows are gathered from the token files by index, touching only the pages they need.
The same layout serves as the tokenization cache, keyed by everything that
changes tokens; entries are written to a temporary directory and renamed into place, so a killed run
never leaves an entry that looks complete.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packcli.safety import owner_tag

CACHE_FORMAT = 3
TOKEN_DTYPE = np.dtype("<i4")


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
                    raise OSError(f"{fh.name}: the token file is shorter than its index; delete the cache entry")
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
    """Streams tokenized batches into a temporary directory; ``finish`` moves it to its final path."""

    def __init__(self, final_path: Path) -> None:
        self.final_path = final_path
        final_path.parent.mkdir(parents=True, exist_ok=True)
        # The host and PID in the name let a later run remove it once this process is gone.
        self.tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{owner_tag()}-", dir=final_path.parent))
        self._ids = open(self.tmp / "input_ids.bin", "wb")  # noqa: SIM115 - closed in finish/abort
        self._labels = open(self.tmp / "labels.bin", "wb")  # noqa: SIM115
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
        self._ids.write(np.ascontiguousarray(ids, dtype=TOKEN_DTYPE).tobytes())
        self._labels.write(np.ascontiguousarray(labels, dtype=TOKEN_DTYPE).tobytes())
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
        self._ids.close()
        self._labels.close()
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
        self._ids.close()
        self._labels.close()
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
