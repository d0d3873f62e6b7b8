"""One packed row, decoded: its samples, and which of their tokens are trained on.

Rows are numbered from 0 across all shards in manifest order. A row is found from the manifest's
per-shard row counts without reading other shards; a sample is found by scanning only the
``sample_index`` column, shard by shard.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packcli.contract import IGNORE_INDEX, SAMPLE_ROLES, TREE_COLUMNS
from packcli.errors import IncompatibleError, InputError, Opt, OutputError, TokenizerError, UsageError, first_line
from packcli.jsontypes import JSONObject
from packcli.output.columns import list_parts
from packcli.output.formats import shard_batches
from packcli.output.manifest import read_checked_manifest
from packcli.report.images import RowImage, image_label, row_images
from packcli.results import Counts, Manifest


@dataclass
class Piece:
    """A run of consecutive tokens of one segment that are all trained, or all masked."""

    trained: bool
    text: str
    tokens: int
    image: int | None = None  # an image's tokens, shown as one piece: its place in the row, from 1


@dataclass
class Segment:
    """One sample in a row (or the padding segment of ``--pad-to-max``, sample_index -1)."""

    sample_index: int
    start: int
    length: int
    padding: bool
    trained_tokens: int
    shown_tokens: int  # the tokens decoded into text and pieces (all but with --max-tokens)
    text: str
    trained_text: list[str]
    pieces: list[Piece]
    input_ids: list[int]
    trained: list[bool]
    piece_index: int = 0  # the piece of a record split by --overflow split
    role: str | None = None  # sample_role of preference data: chosen, rejected, desirable, undesirable
    # The sample's images (an image-text output): image (its place in the row, from 1), ref, size
    # [height, width], grid, tokens, offset (its first token in the row); None for a text output.
    images: list[dict[str, Any]] | None = None
    # A prefix-tree output: the sample's nodes, each {parent (its node in this list, -1 for a root),
    # start (its first token in the sample), length, position (its first token's position)}.
    nodes: list[dict[str, int]] | None = None


@dataclass
class InspectedRow:
    """A decoded row and where it is."""

    directory: str
    row: int
    rows: int
    shard: str
    row_in_shard: int
    max_len: int
    tokens: int
    trained_tokens: int
    tokenizer: str
    tokenizer_matches: bool
    requested_sample_index: int | None
    segments: list[Segment] = field(default_factory=list)
    # The run's trained turns whose reasoning the template left out (the manifest's ``reasoning``); None: none
    reasoning: dict[str, int] | None = None

    def to_dict(self) -> JSONObject:
        out = asdict(self)
        if out["reasoning"] is None:
            del out["reasoning"]
        for segment in out["segments"]:
            trim_segment(segment)
        return out


def trim_segment(segment: JSONObject) -> None:
    """Leave out of a segment's dict the keys its output does not have (as before they existed)."""
    if segment["role"] is None:  # not preference data: the segments are as before roles existed
        del segment["role"]
    if segment["images"] is None:  # a text output: as before images existed
        del segment["images"]
    if segment["nodes"] is None:  # not prefix trees: as before trees existed
        del segment["nodes"]
    for piece in segment["pieces"]:
        if piece["image"] is None:
            del piece["image"]


def locate_row(manifest: Manifest, row: int) -> tuple[str, int]:
    """Return (shard file, row within the shard) of global row ``row``; raise UsageError when out of range."""
    sizes = [e.rows for e in manifest.shards]
    total = sum(sizes)
    if not 0 <= row < total:
        span = f"0..{total - 1}" if total else "none"
        raise UsageError(f"{row} is out of range: the output has {total} rows ({span})", option="row")
    k = int(np.searchsorted(np.cumsum(sizes), row, side="right"))
    return manifest.shards[k].file, row - sum(sizes[:k])


def find_sample(directory: Path, manifest: Manifest, sample_index: int) -> int:
    """Return the global row that holds ``sample_index`` (its first copy); raise InputError when none does."""
    for row, _ in sample_hits(directory, manifest, sample_index):
        return row
    raise in_no_row(manifest, sample_index)


def sample_hits(directory: Path, manifest: Manifest, sample_index: int) -> Iterator[tuple[int, int]]:
    """Yield (global row, segment in the row) of every segment of ``sample_index``, in row order: its
    pieces, its rounds and its repeats. Only the ``sample_index`` column is read, shard by shard."""
    if sample_index < 0:
        raise UsageError(f"must be >= 0, not {sample_index}", option="sample_index")
    first_row = 0
    for entry in manifest.shards:
        try:
            for batch in shard_batches(directory / entry.file, ["sample_index"]):
                segs, index = list_parts(batch.column("sample_index"))
                hits = np.flatnonzero(index == sample_index)
                if len(hits):
                    row_of = np.repeat(np.arange(batch.num_rows), segs)
                    starts = np.cumsum(segs) - segs  # each row's first segment in ``index``
                    for hit in hits.tolist():
                        row = int(row_of[hit])
                        yield first_row + row, hit - int(starts[row])
                first_row += batch.num_rows
        except (OSError, pa.ArrowException) as exc:
            raise _unreadable(directory, entry.file, exc) from exc


def in_no_row(manifest: Manifest, sample_index: int) -> InputError:
    counts = manifest.counts or Counts()
    dropped = ", ".join(f"{reason} {n}" for reason, n in (counts.dropped or {}).items()) or "none"
    records = "?" if counts.records_read is None else counts.records_read
    return InputError(
        f"sample_index {sample_index} is in no row: it numbers the {records} input records "
        f"from 0, and dropped records are in no row (dropped: {dropped})",
        hint=("pack with ", Opt("rejects"), " FILE to list them"),
    )


def read_row(path: Path, row_in_shard: int) -> dict[str, list[int]]:
    """Return one row of a shard as lists, reading batches only up to the one that holds it."""
    seen = 0
    for batch in shard_batches(path):
        if row_in_shard < seen + batch.num_rows:
            return batch.slice(row_in_shard - seen, 1).to_pylist()[0]
        seen += batch.num_rows
    raise OutputError(f"{path.name}: has {seen} rows, fewer than manifest.json says; run packcli verify")


def inspect_row(
    directory: Path,
    row: int | None = None,
    sample_index: int | None = None,
    tokenizer: str | None = None,
    max_tokens: int | None = None,
) -> InspectedRow:
    """Decode one row (by global row number, or the row holding ``sample_index``) into its segments.

    The tokenizer is the one named in the manifest unless ``tokenizer`` is given; ``tokenizer_matches``
    says whether its identity equals the manifest's. With ``max_tokens``, only the first
    ``max_tokens`` tokens of each sample are decoded (``shown_tokens``); ids and labels stay whole.
    """
    check_max_tokens(max_tokens)
    if row is not None and sample_index is not None:
        raise UsageError("cannot be used with ", Opt("sample_index"), "; pass one of them", option="row")
    manifest = read_checked_manifest(directory)
    if sample_index is not None:
        row = find_sample(directory, manifest, sample_index)
    row = 0 if row is None else row
    shard, row_in_shard, data = load_row(directory, manifest, row)
    decoder, name, matches = load_decoder(manifest, tokenizer)
    return InspectedRow(
        directory=str(directory),
        row=row,
        rows=sum(e.rows for e in manifest.shards),
        shard=shard,
        row_in_shard=row_in_shard,
        max_len=manifest.max_len,
        tokens=len(data["input_ids"]),
        trained_tokens=int((np.asarray(data["labels"], dtype=np.int64) != IGNORE_INDEX).sum()),
        tokenizer=name,
        tokenizer_matches=matches,
        requested_sample_index=sample_index,
        segments=row_segments(data, manifest, decoder, max_tokens),
        reasoning=dict(manifest.reasoning) if manifest.reasoning else None,
    )


def check_max_tokens(max_tokens: int | None) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise UsageError(f"must be at least 1, not {max_tokens}", option="max_tokens")


def load_row(directory: Path, manifest: Manifest, row: int) -> tuple[str, int, dict[str, list[int]]]:
    """Return (shard file, row within the shard, the row as lists) of global row ``row``."""
    shard, row_in_shard = locate_row(manifest, row)
    try:
        return shard, row_in_shard, read_row(directory / shard, row_in_shard)
    except (OSError, pa.ArrowException) as exc:
        raise _unreadable(directory, shard, exc) from exc


def load_decoder(manifest: Manifest, tokenizer: str | None) -> tuple[Any, str, bool]:
    """Return the tokenizer that decodes the rows (``tokenizer``, else the manifest's), its name, and whether
    its identity equals the manifest's."""
    identity = manifest.tokenizer or {}
    name = tokenizer or identity.get("name")
    decoder, matches = _load_decoder(name, identity.get("sha256"))
    return decoder, str(name), matches


def row_segments(
    data: dict[str, list[int]],
    manifest: Manifest,
    decoder: Any,
    max_tokens: int | None,
    only: Container[int] | None = None,
) -> list[Segment]:
    """Decode a row's segments (only those numbered in ``only``, when given), in row order."""
    ids = np.asarray(data["input_ids"], dtype=np.int64)
    trained = np.asarray(data["labels"], dtype=np.int64) != IGNORE_INDEX
    segments = []
    start = 0
    # Not strict: a damaged row still decodes as far as its columns agree (verify says what is wrong).
    piece_of = data.get("piece_index") or [0] * len(data["sample_index"])  # none before piece_index existed
    # sample_role: preference and KTO outputs only.
    role_of: Sequence[int | None] = data.get("sample_role") or [None] * len(data["sample_index"])
    images = _images(data, manifest)
    family = ((manifest.tokenizer or {}).get("processor") or {}).get("family")
    tree_nodes = _tree_nodes(data)
    for k, (index, piece, length, role) in enumerate(
        zip(data["sample_index"], piece_of, data["seq_lengths"], role_of, strict=False)
    ):
        if only is not None and k not in only:
            start += length
            continue
        seg_ids = ids[start : start + length]
        seg_trained = trained[start : start + length]
        own = [im for im in images or () if im.sample == k]
        nodes = tree_nodes.get(start) if tree_nodes is not None else None
        cuts = [n["start"] for n in nodes] if nodes else []
        segment = _segment(decoder, int(index), start, seg_ids, seg_trained, max_tokens, own, family, cuts)
        segment.nodes = nodes
        segment.piece_index = int(piece)
        segment.role = SAMPLE_ROLES.get(int(role)) if role is not None else None
        if images is not None:
            segment.images = [
                {
                    "image": im.index + 1,
                    "ref": im.ref.path,
                    "size": list(im.size),
                    "grid": list(im.grid),
                    "tokens": im.tokens,
                    "offset": im.offset,
                }
                for im in own
            ]
        segments.append(segment)
        start += length
    return segments


def _tree_nodes(data: dict[str, Any]) -> dict[int, list[dict[str, int]]] | None:
    """A tree row's nodes by the row offset of their sample's first token (None without tree columns);
    parents become indices into the sample's own list."""
    lengths, parents = data.get(TREE_COLUMNS[0]), data.get(TREE_COLUMNS[1])
    if lengths is None or parents is None:
        return None
    positions = data["position_ids"]
    sample_starts = set(np.cumsum([0, *data["seq_lengths"]])[:-1].tolist())
    by_sample: dict[int, list[dict[str, int]]] = {}
    start = sample_start = first_node = 0
    for k, (length, parent) in enumerate(zip(lengths, parents, strict=False)):
        if start in sample_starts:
            sample_start, first_node = start, k
        node = {"parent": parent - first_node if parent >= 0 else -1, "start": start - sample_start}
        node |= {"length": int(length), "position": int(positions[start]) if start < len(positions) else 0}
        by_sample.setdefault(sample_start, []).append(node)
        start += int(length)
    return by_sample


def _load_decoder(name: str | None, sha256: str | None) -> tuple[Any, bool]:
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

    try:
        encoder = Encoder(name, None, EncodeOptions(), encoder="tokenizers")  # it only decodes
    except TokenizerError as exc:
        if Opt("tokenizer") in exc.parts:  # its fix already names the option
            raise
        raise TokenizerError(*exc.parts, "; or pass ", Opt("tokenizer"), " to decode with another one") from exc
    return encoder.tokenizer, encoder.identity()["sha256"] == sha256


def _images(data: dict[str, Any], manifest: Manifest) -> list[RowImage] | None:
    """The row's images (None for a text output); none when the row's image columns do not fit its tokens."""
    if data.get("image_refs") is None:
        return None
    token_id = ((manifest.tokenizer or {}).get("processor") or {}).get("image_token_id")
    if not isinstance(token_id, int):
        return []
    try:
        return row_images(data, 0, token_id)
    except IncompatibleError:
        return []  # a damaged row decodes token by token (verify says what is wrong)


def _segment(
    decoder: Any,
    index: int,
    start: int,
    ids: np.ndarray,
    trained: np.ndarray,
    max_tokens: int | None = None,
    images: Sequence[RowImage] = (),
    family: str | None = None,
    node_starts: Sequence[int] = (),
) -> Segment:
    padding = index == -1
    all_ids, all_trained = ids, trained
    ids, trained = ids[:max_tokens], trained[:max_tokens]
    # Decode runs of equally-flagged tokens, not single tokens: a byte-level BPE token may hold part of
    # a character, which only decodes together with its neighbours. An image's tokens are one piece.
    cuts = set((np.flatnonzero(np.diff(trained.astype(np.int8))) + 1).tolist())
    cuts |= {c for c in node_starts if c < len(ids)}  # a piece never spans two tree nodes
    image_at: dict[int, RowImage] = {}
    for image in images:
        begin = image.offset - start
        if begin < len(ids):
            image_at[begin] = image
            cuts |= {begin, min(begin + image.span, len(ids))}
    bounds = sorted({0, *cuts, len(ids)})
    pieces = []
    if not padding:
        for a, b in pairwise(bounds):
            if b > a:
                held = image_at.get(a)
                if held is not None:
                    pieces.append(Piece(False, image_label(held, family), b - a, held.index + 1))
                else:
                    pieces.append(Piece(bool(trained[a]), _decode(decoder, ids[a:b]), b - a))
    text = "" if padding else _decode(decoder, ids)
    if image_at and not padding:  # the text between the images decoded, each image as its label
        cut_at = sorted({0, len(ids), *image_at, *(min(a + image_at[a].span, len(ids)) for a in image_at)})
        text = "".join(
            image_label(image_at[a], family) if a in image_at else _decode(decoder, ids[a:b])
            for a, b in pairwise(cut_at)
            if b > a
        )
    return Segment(
        sample_index=index,
        start=start,
        length=len(all_ids),
        padding=padding,
        trained_tokens=int(all_trained.sum()),
        shown_tokens=0 if padding else len(ids),
        text=text,
        trained_text=[p.text for p in pieces if p.trained],
        pieces=pieces,
        input_ids=all_ids.tolist(),
        trained=all_trained.tolist(),
    )


def _decode(decoder: Any, ids: np.ndarray) -> str:
    return decoder.decode(ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _unreadable(directory: Path, file: str, exc: BaseException) -> OutputError:
    first = first_line(exc)
    return OutputError(f"{file}: cannot be read ({first}); run packcli verify {directory}")
