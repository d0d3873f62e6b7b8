"""What an output's files record: ``manifest.json`` (``Manifest``, its ``Counts`` and ``ShardEntry``
list) and the rejects file's lines (``RejectEntry``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from packcli.jsontypes import JSONObject
from packcli.results.base import IN_MEMORY, DamagedResult, JSONRecord, field_names, record_dict, record_from_dict
from packcli.results.sections import DedupSummary, EvalSummary, MixSummary, StepBalance
from packcli.results.store import TokenizerIdentity
from packcli.results.summary import EncoderInfo, Lost, Split

# -- the manifest ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ShardEntry(JSONRecord):
    """One shard as the manifest lists it: a bare file name, its rows, tokens (padding included), largest
    input id and sha256; as a writer returns it, also the image counts of its rows (``images``, not
    written: packcli.output.images.with_written_images sums them into the manifest's tokenizer)."""

    file: str
    rows: int
    tokens: int
    max_token_id: int | None = None  # absent from outputs written before it was recorded
    sha256: str
    # Image-text rows: samples, images, image_tokens, embedded (packcli.output.images.IMAGE_COUNTS).
    images: dict[str, int] | None = field(default=None, metadata={IN_MEMORY: True})

    WHAT: ClassVar[str] = "a shard entry"


@dataclass(frozen=True, kw_only=True)
class Counts:
    """The manifest's record counts (the summary's, under one key); ``split`` and ``limit`` when used."""

    records_read: int | None = None
    packed: int | None = None
    samples: int | None = None
    dropped: dict[str, int] | None = None
    truncated: int | None = None
    duplicated: int | None = None
    split: Split | None = None
    limit: int | None = None

    def to_dict(self) -> JSONObject:
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> Counts:
        return record_from_dict(cls, data, "counts", {"split": Split.from_dict})


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """``manifest.json``: how the output was made, what it holds, and its shards.

    Only ``max_len`` and ``shards`` are needed to read an output; every other key is None when an older
    (or foreign) manifest lacks it, and then left out again by ``to_dict``.
    """

    packcli_version: str | None = None
    task: str | None = None  # absent before preference data: sft
    sample_roles: dict[str, str] | None = None  # preference and KTO outputs
    options: dict[str, Any] | None = None
    tokenizer: TokenizerIdentity | None = None
    inputs: list[dict[str, Any]] | None = None
    counts: Counts | None = None
    lost: Lost | None = None
    turns_fixed: dict[str, int] | None = None
    empty_answers: int | None = None
    leading_answers: int | None = None
    tools_left_out: int | None = None
    reasoning: dict[str, int] | None = None
    expanded: dict[str, int] | None = None
    trees: dict[str, int] | None = None  # --prefix-tree: as in the summary
    warnings: list[str] | None = None
    tokens: int | None = None
    trainable_tokens: int | None = None
    rows: int | None = None
    max_len: int
    fill: float | None = None
    lower_bound_l1: int | None = None
    lower_bound_l2: int | None = None
    rows_over_l2: int | None = None
    rows_over_l2_fraction: float | None = None
    padding_tokens: int | None = None
    alignment_padding_tokens: int | None = None
    algorithm: str | None = None
    world_size: int | None = None
    rank_tokens: list[int] | None = None
    rank_token_spread: float | None = None
    step_balance: StepBalance | None = None  # --world-size above 1: as in the summary
    columns: list[str] | None = None
    max_token_id: int | None = None
    shards: list[ShardEntry]
    mix: MixSummary | None = None  # --mix: as in the summary; the sources the source column numbers
    dedup: DedupSummary | None = None  # --dedup exact: as in the summary
    eval: EvalSummary | None = None  # the eval split: as in the summary (its own manifest in eval/)
    prefix_trees: bool | None = None  # true when the rows hold prefix trees (contract.PREFIX_TREES)
    index_files: list[str] | None = None  # files a format keeps beside its shards (MDS's index.json)
    rejects_file: str | None = None  # the rejects file, when written inside the output
    encoder: EncoderInfo | None = None  # the text encoder that made the tokens: as in the summary

    def to_dict(self) -> JSONObject:
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> Manifest:
        def entries(value: Any) -> list[ShardEntry]:
            if not isinstance(value, list):
                raise DamagedResult("shards is not a list")
            return [ShardEntry.from_dict(e) for e in value]

        return record_from_dict(
            cls,
            data,
            "the manifest",
            {
                "counts": Counts.from_dict,
                "lost": Lost.from_dict,
                "shards": entries,
                "dedup": DedupSummary.from_dict,
                "mix": MixSummary.from_dict,
                "eval": EvalSummary.from_dict,
                "step_balance": StepBalance.from_dict,
                "encoder": EncoderInfo.from_dict,
            },
        )

    @property
    def files(self) -> list[str]:
        """The shard files, in row order."""
        return [entry.file for entry in self.shards]


# -- the rejects file ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RejectEntry(JSONRecord):
    """One line of the rejects file: where the record is, why it was left out, and the record (its first
    characters when long: ``record_truncated``, with ``record_chars`` its full length)."""

    sample_index: int
    piece_index: int
    source: str
    position: int
    unit: str  # line | record
    reason: str
    detail: str
    record: str
    record_truncated: bool
    record_chars: int

    WHAT: ClassVar[str] = "a rejects entry"


REJECT_KEYS = frozenset(field_names(RejectEntry))
