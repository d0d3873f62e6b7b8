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

import contextlib
import errno
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from packcli.contract import file_sha256
from packcli.errors import OutputError, Text, first_line
from packcli.io.uri import is_uri, join, remove_uri_dir
from packcli.owned import owner_tag
from packcli.results import FileDigest, Segment, StoreMeta
from packcli.store.integrity import TOKEN_FILES, DamagedStore, Digest, check_store, meta_digest, segment_files
from packcli.store.nodes import TreeNodes

TOKEN_DTYPE = np.dtype("<i4")
ARRAYS = ("sample_index", "piece_index", "lengths", "trainable", "first_trained", "positions")
TREE_ARRAYS = ("tree_node_counts", "tree_node_lengths", "tree_node_parents")  # --prefix-tree (TreeNodes)


# A reader keeps at most this many segments' files open (a store assembled from many cache parts has
# a segment per part): two descriptors each.
OPEN_SEGMENTS = 128

# Batches are small (a worker's 256 samples): their per-sample arrays are joined into chunks of at least
# this many samples as they come, so the writer holds a few large arrays, which go back to the system
# when freed, rather than 40,000 small ones per 10M samples, which stay in the heap once freed.
CHUNK_SAMPLES = 1 << 16


class _Column:
    """A per-sample array received batch by batch, kept in chunks of at least CHUNK_SAMPLES samples."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.pending: list[np.ndarray] = []
        self.pending_samples = 0
        self.samples = 0

    def append(self, value: np.ndarray) -> None:
        self.pending.append(value)
        self.pending_samples += len(value)
        self.samples += len(value)
        if self.pending_samples >= CHUNK_SAMPLES:
            self.chunks.append(np.concatenate(self.pending))
            self.pending, self.pending_samples = [], 0

    def join(self, empty: np.ndarray) -> np.ndarray:
        """The whole array (``empty`` when no batch came); the chunks are let go."""
        parts, self.chunks, self.pending = self.chunks + self.pending, [], []
        return np.concatenate(parts) if parts else empty


def _write_error(path: Path, exc: OSError, fix: Text) -> OutputError:
    return OutputError(f"{path}: cannot write the token store ({exc.strerror or exc})", hint=fix)


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


class TokenStoreWriter:
    """Streams tokenized batches into a temporary directory; ``finish`` moves it to its final path.

    Every failure to write (a read-only or full disk, a path that is a file) is an OutputError that
    names ``where`` and ends with ``fix``: the caller knows whether the store is the cache or scratch
    space, and which path the user gave for it.
    """

    def __init__(self, final_path: Path, fix: Text = "free disk space", where: Path | None = None) -> None:
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
            self._ids = open(self.tmp / TOKEN_FILES[0], "wb")  # noqa: SIM115 - closed in finish/abort
            self._labels = open(self.tmp / TOKEN_FILES[1], "wb")  # noqa: SIM115
        except OSError as exc:
            self.abort()
            raise _write_error(self.where, exc, fix) from exc
        self._arrays = {k: _Column() for k in ARRAYS}
        self._roles = _Column()
        self._keys = _Column()  # content keys, while every batch gave them
        self._keys_whole = True
        self._tree = {k: _Column() for k in TREE_ARRAYS}  # --prefix-tree: the samples' nodes
        self._tree_on = False
        self._local_tokens = 0  # tokens written by add() into the one local segment (prefix "")
        self._segments: list[Segment] = []  # segments written elsewhere (add_segment), in order
        self._segment_files: dict[str, FileDigest] = {}
        # The token files' sizes and sha256, taken as they are written: finish never reads them back.
        self._digests = {TOKEN_FILES[0]: Digest(), TOKEN_FILES[1]: Digest()}

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
        content_keys: np.ndarray | None = None,
        tree_nodes: TreeNodes | None = None,
    ) -> None:
        if len(lengths) == 0:
            return
        self._add_keys(content_keys, len(lengths))
        self._add_tree(tree_nodes, lengths)
        assert not self._segments, "a store's samples are added by add() or by add_segment(), not both"
        try:
            for fh, name, values in ((self._ids, TOKEN_FILES[0], ids), (self._labels, TOKEN_FILES[1], labels)):
                data = np.ascontiguousarray(values, dtype=TOKEN_DTYPE).tobytes()
                fh.write(data)
                self._digests[name].update(data)
        except OSError as exc:
            raise _write_error(self.where, exc, self.fix) from exc
        self._local_tokens += len(ids)
        self._add_arrays(sample_index, lengths, trainable, first_trained, positions, piece_index, sample_role)

    def add_segment(
        self,
        segment: Segment,
        files: dict[str, FileDigest],
        sample_index: np.ndarray,
        lengths: np.ndarray,
        trainable: np.ndarray,
        first_trained: np.ndarray,
        positions: np.ndarray,
        piece_index: np.ndarray | None = None,
        sample_role: np.ndarray | None = None,
        content_keys: np.ndarray | None = None,
        tree_nodes: TreeNodes | None = None,
    ) -> None:
        """Add samples whose tokens another process wrote as a segment (``{"prefix", "tokens"}``).

        ``files`` gives the size and sha256 of the segment's two files, measured as they were written,
        so that the store's checksums never need its tokens read back here.
        """
        if len(lengths) == 0:
            return
        self._add_keys(content_keys, len(lengths))
        self._add_tree(tree_nodes, lengths)
        assert self._local_tokens == 0, "a store's samples are added by add() or by add_segment(), not both"
        assert int(segment["tokens"]) == int(np.asarray(lengths, dtype=np.int64).sum())
        self._segments.append({"prefix": segment["prefix"], "tokens": int(segment["tokens"])})
        self._segment_files.update(files)
        self._add_arrays(sample_index, lengths, trainable, first_trained, positions, piece_index, sample_role)

    def _add_keys(self, keys: np.ndarray | None, n: int) -> None:
        """keep the batch's content keys; a batch without them leaves the store without any."""
        if keys is None or len(keys) != n:
            self._keys_whole = False
        elif self._keys_whole:
            self._keys.append(keys)

    def _add_tree(self, nodes: TreeNodes | None, lengths: np.ndarray) -> None:
        """Keep the batch's tree nodes (--prefix-tree: every batch gives them, plain samples one node each)."""
        if nodes is None and not self._tree_on:
            return
        if not self._tree_on:
            assert not self._arrays["lengths"].samples, "a store's batches all give tree nodes, or none does"
            self._tree_on = True
        if nodes is None:
            nodes = TreeNodes.plain(lengths)
        for key, value in zip(TREE_ARRAYS, (nodes.counts, nodes.lengths, nodes.parents), strict=True):
            self._tree[key].append(value)

    def _add_arrays(
        self,
        sample_index: np.ndarray,
        lengths: np.ndarray,
        trainable: np.ndarray,
        first_trained: np.ndarray,
        positions: np.ndarray,
        piece_index: np.ndarray | None,
        sample_role: np.ndarray | None = None,
    ) -> None:
        if sample_role is not None or self._roles.samples:
            # Preference data: every sample's role is stored (a store without roles is all SFT).
            if not self._roles.samples and self._arrays["lengths"].samples:
                self._roles.append(np.zeros(self._arrays["lengths"].samples, np.int8))
            self._roles.append(np.zeros(len(lengths), np.int8) if sample_role is None else sample_role)
        for key, value in (
            ("sample_index", sample_index),
            ("piece_index", np.zeros(len(lengths), np.int32) if piece_index is None else piece_index),
            ("lengths", lengths),
            ("trainable", trainable),
            ("first_trained", first_trained),
            ("positions", positions),
        ):
            self._arrays[key].append(value)

    def finish(self, meta: StoreMeta, segment_root: str | None = None, verify: bool = True) -> TokenStore:
        """Close the files, record their checksums, move the store into place and return it.

        ``meta``: the store's metadata but its segments, files and checksum, which are set here.

        ``segment_root``: the URI where the segments added by ``add_segment`` are (None: under the
        store's directory). The store moved into place is not read back: its token files' checksums
        were taken from the bytes as they were written. ``verify``: when another run finished the same
        entry first, check theirs by reading it whole (the local engine does; the Ray engine, whose
        driver never reads tokens, does not).
        """
        assert self.tmp is not None
        theirs = False
        try:
            self._ids.close()
            self._labels.close()
            # Each per-sample array joined from its chunks, which are let go at once: the peak is the
            # arrays once plus one of them, not twice over (10M samples: about 45 bytes each).
            arrays: dict[str, Any] = {}
            for k in ARRAYS:
                arrays[k] = self._arrays[k].join(np.zeros(0, np.int64 if k == "sample_index" else np.int32))
            if self._roles.samples:
                arrays["sample_role"] = self._roles.join(np.zeros(0, np.int8))
            if self._keys_whole:
                arrays["content_key"] = self._keys.join(np.zeros((0, 2), "<u8"))
            tree = {k: self._tree[k].join(np.zeros(0, np.int32)) for k in TREE_ARRAYS} if self._tree_on else {}
            np.savez(self.tmp / "samples.npz", **{**arrays, **tree})
            written = {}  # the token files, hashed as they were written
            if self._segments:  # the tokens are in segments written elsewhere: no local token files
                for name in TOKEN_FILES:
                    (self.tmp / name).unlink()
                segments = self._segments
            else:
                segments = [{"prefix": "", "tokens": self._local_tokens}]
                written = {name: digest.entry() for name, digest in self._digests.items()}
            names = sorted(p.name for p in self.tmp.iterdir() if p.is_file() and p.name not in written)
            files: dict[str, FileDigest] = {
                name: {"bytes": (self.tmp / name).stat().st_size, "sha256": file_sha256(self.tmp / name)}
                for name in names
            }
            files = dict(sorted({**files, **written, **self._segment_files}.items()))
            root = segment_root or meta.segment_root
            body = replace(meta, segments=segments, files=files, segment_root=root).to_dict()
            on_disk = {**body, "meta_sha256": meta_digest(body)}
            # Written last: a store without a whole meta.json fails its check and is rebuilt.
            (self.tmp / "meta.json").write_text(json.dumps(on_disk, indent=1, sort_keys=True))
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
                theirs = True
        except OSError as exc:
            raise _write_error(self.where, exc, self.fix) from exc
        if theirs:
            return load_store(self.final_path, verify=verify)
        # This run's entry: the arrays in memory are those just saved (not loaded again from samples.npz).
        meta = StoreMeta.from_dict(json.loads((self.final_path / "meta.json").read_text()))
        return TokenStore(path=self.final_path, meta=meta, **arrays, tree_nodes=TreeNodes.stored(tree))

    def abort(self) -> None:
        for fh in (self._ids, self._labels):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def load_store(
    path: Path, verify: bool = True, check_digests: Callable[[str, dict[str, FileDigest]], None] | None = None
) -> TokenStore:
    """Load a finished store's per-sample arrays and metadata, checked first unless ``verify`` is False."""
    if verify:
        meta = check_store(path, check_digests)
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
    path: Path, check_digests: Callable[[str, dict[str, FileDigest]], None] | None = None
) -> TokenStore | None:
    """Return the checked store at ``path``, or None when there is none.

    Raise DamagedStore when something is there but fails the checks: it must be rebuilt, not used.
    """
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir():
        raise DamagedStore(f"{path}: is not a directory")
    return load_store(path, check_digests=check_digests)
