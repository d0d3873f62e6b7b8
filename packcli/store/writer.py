"""A token store being written (``TokenStoreWriter``): the tokens of each batch appended to the token files
as they come, hashed as they are written, the per-sample arrays kept in chunks, and the whole moved into
place at ``finish`` (``packcli.store.tokens`` describes the layout).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from packcli.contract import file_sha256
from packcli.errors import OutputError, Text
from packcli.owned import owner_tag
from packcli.procs import cleanup
from packcli.results import FileDigest, Segment, StoreMeta
from packcli.store.integrity import TOKEN_FILES, Digest, keep_stamps, meta_digest
from packcli.store.nodes import TreeNodes
from packcli.store.tokens import ARRAYS, TOKEN_DTYPE, TREE_ARRAYS, TokenStore, load_store

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
            self.tmp = cleanup.temporary(Path(tempfile.mkdtemp(prefix=f".tmp-{owner_tag()}-", dir=final_path.parent)))
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
            keep_stamps(self.tmp, on_disk)
            if self.final_path.is_dir() and not self.final_path.is_symlink():
                shutil.rmtree(self.final_path, ignore_errors=True)
            elif self.final_path.exists() or self.final_path.is_symlink():
                self.final_path.unlink()
            try:
                os.replace(self.tmp, self.final_path)
                cleanup.kept(self.tmp)
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
            cleanup.kept(self.tmp)
