"""One input record as packed: each of its samples, decoded, with the row it sits in and its place there.

A record is one sample in one row, unless it was split into pieces (``--overflow split``), expanded
into rounds (``--expand-turns``), given as a preference pair (its chosen and rejected samples) or
repeated by a mixture (``--mix``): then each of its samples is an occurrence, in the record's order
(by ``piece_index``; a repeat's copies by row). Only the ``sample_index`` column of the shards is
scanned to find them; only the rows that hold them are read, and only their segments decoded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from packcli.jsontypes import JSONObject
from packcli.output.manifest import read_checked_manifest
from packcli.report.inspect import (
    Segment,
    check_max_tokens,
    in_no_row,
    load_decoder,
    load_row,
    row_segments,
    sample_hits,
    trim_segment,
)


@dataclass
class Occurrence:
    """One sample of the record, where it is: its row (global, and in its shard) and its first token there."""

    row: int
    shard: str
    row_in_shard: int
    offset: int  # the sample's first token in the row (its segment's ``start``)
    row_tokens: int  # the row's tokens, this sample's and the others'
    segment: Segment


@dataclass
class InspectedSample:
    """An input record's samples, decoded, each with its row and offset (``occurrences``: by piece, then row)."""

    directory: str
    sample_index: int
    rows: int
    max_len: int
    tokenizer: str
    tokenizer_matches: bool
    occurrences: list[Occurrence] = field(default_factory=list)
    # The run's trained turns whose reasoning the template left out (the manifest's ``reasoning``); None: none
    reasoning: dict[str, int] | None = None

    def to_dict(self) -> JSONObject:
        out = asdict(self)
        if out["reasoning"] is None:
            del out["reasoning"]
        for occurrence in out["occurrences"]:
            trim_segment(occurrence["segment"])
        return out


def inspect_sample(
    directory: Path, sample_index: int, tokenizer: str | None = None, max_tokens: int | None = None
) -> InspectedSample:
    """Decode every sample of input record ``sample_index`` (not the rest of their rows), with where each is.

    The tokenizer and ``max_tokens`` are as for ``inspect_row``. Raises InputError when the record is in
    no row (dropped, or past the records read).
    """
    check_max_tokens(max_tokens)
    manifest = read_checked_manifest(directory)
    by_row: dict[int, list[int]] = {}
    for row, k in sample_hits(directory, manifest, sample_index):
        by_row.setdefault(row, []).append(k)
    if not by_row:
        raise in_no_row(manifest, sample_index)
    decoder, name, matches = load_decoder(manifest, tokenizer)
    occurrences = []
    for row, segments in by_row.items():
        shard, row_in_shard, data = load_row(directory, manifest, row)
        for segment in row_segments(data, manifest, decoder, max_tokens, only=set(segments)):
            occurrences.append(Occurrence(row, shard, row_in_shard, segment.start, len(data["input_ids"]), segment))
    occurrences.sort(key=lambda o: (o.segment.piece_index, o.row, o.offset))  # the record's order, then the rows'
    return InspectedSample(
        directory=str(directory),
        sample_index=sample_index,
        rows=sum(e.rows for e in manifest.shards),
        max_len=manifest.max_len,
        tokenizer=name,
        tokenizer_matches=matches,
        occurrences=occurrences,
        reasoning=dict(manifest.reasoning) if manifest.reasoning else None,
    )
