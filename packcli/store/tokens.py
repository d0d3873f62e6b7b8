"""The on-disk store of tokenized samples, read by offset when shards are written.

A finished store is a directory holding the token files (every kept sample's tokens, concatenated,
little-endian int32, in one or more *segments*: a segment is a pair ``PREFIXinput_ids.bin`` and
``PREFIXlabels.bin``; the local engine writes one, with the empty prefix; the Ray engine one per part of
the inputs, written where it was tokenized, under ``segments/``),
``samples.npz`` (per sample: sample_index, piece_index, length, trainable count, first trained position and record
position, so the plan never reads token data) and ``meta.json`` (counts, dropped records by reason,
sources). Rows are gathered from the token files by index, touching only the pages they need.
The same layout serves as the tokenization cache, keyed by everything that
changes tokens; entries are written to a temporary directory and renamed into place, so a killed run
never leaves an entry that looks complete.

``meta.json`` lists the segments in order (their prefix and token count: a sample's offset in the
concatenation of the segments finds its segment) and records the size and sha256 of every other file
of the store and a sha256 of its own content, written at ``finish``. The segments may live at a
filesystem URI (``segment_root`` in meta.json, e.g. ``s3://bucket/out/.packcli-tokens/KEY``) rather
than in the directory: a store whose tokens a cluster wrote to object storage. ``load_store`` checks
all of them before a store is used (segments at a URI by size), so a damaged entry (changed bytes, a
truncated or missing file, a meta.json that is not JSON or lacks a key) is reported as
``DamagedStore`` and never read: the caller rebuilds it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packcli.errors import first_line
from packcli.io.uri import is_uri, join, remove_uri_dir
from packcli.results import FileDigest, Segment, StoreMeta
from packcli.store.integrity import DamagedStore, check_store, segment_files
from packcli.store.nodes import TreeNodes

TOKEN_DTYPE = np.dtype("<i4")
ARRAYS = ("sample_index", "piece_index", "lengths", "trainable", "first_trained", "positions")
TREE_ARRAYS = ("tree_node_counts", "tree_node_lengths", "tree_node_parents")  # --prefix-tree (TreeNodes)


# A reader keeps at most this many segments' files open (a store assembled from many cache parts has
# a segment per part): two descriptors each.
OPEN_SEGMENTS = 128


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
    meta: StoreMeta
    # int8 per sample: its sample_role (packcli.contract.SAMPLE_ROLES); all 0 (SFT) for a store without one.
    sample_role: np.ndarray | None = None
    # Seconds by stage of the run that made the store (read, decode, tokenize, store, cpu, wall); empty
    # for a store found in the cache. Not saved.
    seconds: dict[str, float] = field(default_factory=dict)
    # uint64 (n, 2) per sample: its record's content key (packcli.records.dedup); None in a store without.
    content_key: np.ndarray | None = None
    # --prefix-tree: every sample's nodes (packcli.store.nodes.TreeNodes); None in a store of plain samples.
    tree_nodes: TreeNodes | None = None

    def __post_init__(self) -> None:
        if self.sample_role is None:
            self.sample_role = np.zeros(len(self.lengths), dtype=np.int8)

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """Offset of each sample's first token in the token files (int64)."""
        starts = np.zeros(len(self.lengths), dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=starts[1:])
        return starts

    @property
    def segment_root(self) -> str:
        """Where the segments' files are: the store's directory, or the URI in meta.json."""
        return self.meta.segment_root or str(self.path)

    def discard_elsewhere(self) -> None:
        """Remove the segments a store that is not kept has outside its directory (at ``segment_root``, a
        URI: under an output URI, where the Ray engine writes them); its directory is its owner's to remove."""
        root = self.meta.segment_root
        if root:
            remove_uri_dir(root)

    def source_of(self, sample_index: int) -> tuple[str, str]:
        """Return the path of a sample's source and the unit of its positions there (line or record)."""
        sources = self.meta.sources
        k = int(np.searchsorted(np.asarray(self.meta.source_starts), sample_index, side="right")) - 1
        return sources[max(k, 0)].path, sources[max(k, 0)].unit

    def open_tokens(self) -> TokenReader:
        """Open the token files for reading samples by offset."""
        return TokenReader(self.segment_root, self.meta.segments)


class TokenReader:
    """Reads samples' tokens from the segments' token files by offset (a local path or a URI).

    Explicit reads rather than a memory map: rows gather samples from all over the files, and mapped
    pages (with the pages the kernel maps around each fault) would count in the resident set, growing
    with the data. Read pages stay in the page cache, which is not the process's memory. A segment's
    files are opened on first use; a sample never spans two segments.
    """

    def __init__(self, root: str | Path, segments: list[Segment]) -> None:
        self.root = str(root)
        self.prefixes = [s["prefix"] for s in segments]
        self.seg_starts = np.zeros(len(segments) + 1, dtype=np.int64)
        np.cumsum([int(s["tokens"]) for s in segments], out=self.seg_starts[1:])
        self._open: dict[int, tuple[Any, ...]] = {}
        self._fs: Any = None
        if is_uri(self.root):
            from pyarrow import fs as pafs

            self._fs, self._base = pafs.FileSystem.from_uri(self.root)

    def _files(self, seg: int) -> tuple[Any, ...]:
        if seg in self._open:
            self._open[seg] = self._open.pop(seg)  # the most recently used last
        else:
            if len(self._open) >= OPEN_SEGMENTS:  # the least recently used pair closed
                for fh in self._open.pop(next(iter(self._open))):
                    fh.close()
            names = segment_files(self.prefixes[seg])
            if self._fs is None:
                self._open[seg] = tuple(open(os.path.join(self.root, n), "rb") for n in names)  # noqa: SIM115
            else:
                self._open[seg] = tuple(self._fs.open_input_file(f"{self._base.rstrip('/')}/{n}") for n in names)
        return self._open[seg]

    def _read(self, fh: Any, out: np.ndarray, offset: int) -> bool:
        # numpy's stubs give ndarray __buffer__ only for Python 3.12+, though it has the buffer protocol.
        view = memoryview(out).cast("B")  # type: ignore[arg-type]
        if self._fs is None:
            return os.preadv(fh.fileno(), [view], offset) == len(view)
        data = fh.read_at(len(view), offset)
        view[: len(data)] = data
        return len(data) == len(view)

    def gather(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return the input_ids and labels of the samples at token offsets ``starts``, concatenated."""
        total = int(lengths.sum())
        ids = np.empty(total, dtype=TOKEN_DTYPE)
        labels = np.empty(total, dtype=TOKEN_DTYPE)
        size = TOKEN_DTYPE.itemsize
        starts = np.asarray(starts, dtype=np.int64)
        segs = np.searchsorted(self.seg_starts, starts, side="right") - 1
        local = starts - self.seg_starts[np.clip(segs, 0, len(self.prefixes) - 1)] if len(self.prefixes) else starts
        pos = 0
        for seg, start, n in zip(segs.tolist(), local.tolist(), np.asarray(lengths).tolist(), strict=True):
            if n == 0:
                continue
            if not 0 <= seg < len(self.prefixes):
                raise DamagedStore(f"{self.root}: a sample lies outside the store's segments; run again")
            for fh, out in zip(self._files(seg), (ids, labels), strict=True):
                if not self._read(fh, out[pos : pos + n], start * size):
                    # Not an OSError: that would read as a disk problem, and no disk fix helps.
                    name = getattr(fh, "name", None) or join(self.root, segment_files(self.prefixes[seg])[0])
                    raise DamagedStore(
                        f"{name}: the token file became shorter than its index while in use; run again "
                        "(a checked store is rebuilt)"
                    )
            pos += n
        return ids, labels

    def close(self) -> None:
        for pair in self._open.values():
            for fh in pair:
                fh.close()
        self._open.clear()

    def __enter__(self) -> TokenReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_store(
    path: Path,
    verify: bool = True,
    check_digests: Callable[[str, dict[str, FileDigest]], None] | None = None,
    remember: bool = True,
) -> TokenStore:
    """Load a finished store's per-sample arrays and metadata, checked first unless ``verify`` is False
    (``remember``: keep the stamps of the files the check read; see ``check_store``)."""
    if verify:
        meta = check_store(path, check_digests, remember)
    else:
        meta = StoreMeta.from_dict(json.loads((path / "meta.json").read_text()))
    try:
        with np.load(path / "samples.npz") as data:
            arrays = {k: data[k] for k in ARRAYS}
            if "sample_role" in data:
                arrays["sample_role"] = data["sample_role"]
            if "content_key" in data:
                arrays["content_key"] = data["content_key"]
            tree = {k: data[k] for k in TREE_ARRAYS if k in data}
    except (OSError, ValueError, KeyError) as exc:
        raise DamagedStore(f"{path / 'samples.npz'}: cannot be read ({first_line(exc)})") from exc
    return TokenStore(path=path, meta=meta, **arrays, tree_nodes=TreeNodes.stored(tree))


def find_store(
    path: Path, check_digests: Callable[[str, dict[str, FileDigest]], None] | None = None, remember: bool = True
) -> TokenStore | None:
    """Return the checked store at ``path``, or None when there is none.

    Raise DamagedStore when something is there but fails the checks: it must be rebuilt, not used.
    ``remember``: keep the stamps of the files the check read (False: nothing is written there).
    """
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir():
        raise DamagedStore(f"{path}: is not a directory")
    return load_store(path, check_digests=check_digests, remember=remember)
