"""The results of ``packcli stats``: a packed output's figures (``OutputStats``) and raw inputs' at each
max length (``RawStats``), read like the dicts they replaced (``result["rows"]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packcli.errors import Message
from packcli.jsontypes import JSONObject
from packcli.results.base import record_dict
from packcli.results.sections import EvalSummary, MixSummary, StepBalance


class _ByKey:
    """A result read as the dict it replaced: ``result["rows"]``, ``result.get("mix")``, ``"mix" in result``
    (its JSON keys, as ``to_dict()`` gives them: nested records as dicts)."""

    def to_dict(self) -> JSONObject:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        """The value of a JSON key, as when the result was a dict; KeyError when absent."""
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of a JSON key, or ``default`` when the result has none."""
        return self.to_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()


@dataclass(frozen=True, kw_only=True)
class Distribution:
    """The least, mean, median, 90th percentile and largest of some lengths (zeros when there are none)."""

    min: int
    mean: float
    median: float
    p90: float
    max: int

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class BinCounts:
    """A histogram's bins: their edges (right-closed), labels and counts."""

    edges: list[float]
    labels: list[str]
    counts: list[int]

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class PerRow:
    """How many of something a row holds: least, mean, most, and (samples) how many rows hold each count
    (``{"samples": k, "rows": n}``)."""

    min: int
    mean: float
    max: int
    histogram: list[dict[str, int]] | None = None

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class PairStats:
    """Preference and KTO outputs: samples by role, the pairs and pairs per row, and what padded pairs cost."""

    roles: dict[str, int]
    pairs: int
    pairs_per_row: PerRow
    padding_tokens_padded_pairs: int
    rows_padded_pairs: int

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class ImageStats:
    """An image-text output: its images, the samples holding them, their tokens and where they are
    (``per_row``: max and mean; ``embedded`` in the rows, ``referenced`` by path)."""

    images: int
    samples: int
    image_tokens: int
    image_token_share: float
    per_row: dict[str, float]
    embedded: int
    referenced: int

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class TreeStats:
    """Rows of prefix trees: their tokens, the tokens of the samples expanded again, and what trees saved."""

    tokens: int
    expanded_tokens: int
    tokens_saved: int
    tokens_ratio: float

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class OutputStats(_ByKey):
    """``packcli stats --json`` of a packed output (``packcli.stats(directory)``): its rows, samples and
    tokens, the row bounds, what packing saved, the histograms, and the manifest's counts and sections."""

    mode: str  # packed
    directory: str
    max_len: int
    shards: int
    rows: int
    sequences: int
    samples: int
    records: int
    tokens: int
    trainable_tokens: int
    padding_tokens: int
    padding_segment_tokens: int
    alignment_padding_tokens: int
    fill: float
    lower_bound_l1: int
    lower_bound_l2: int
    rows_over_l2: int
    rows_over_l2_fraction: float
    samples_per_row: PerRow
    sample_length: Distribution
    length_histogram: BinCounts
    row_fill_histogram: BinCounts
    records_read: int
    dropped: dict[str, int]
    truncated: int
    duplicated: int
    batch_size: int
    rows_without_packing: int
    padding_tokens_without_packing: int
    padding_tokens_batch_padded: int
    padding_saved: int
    padding_saved_vs_batch_padded: int
    preference: PairStats | None = None
    images: ImageStats | None = None
    prefix_trees: TreeStats | None = None
    mix: MixSummary | None = None
    eval: EvalSummary | None = None
    reasoning: dict[str, int] | None = None
    step_balance: StepBalance | None = None  # an output packed with --world-size above 1

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class PolicyKept:
    """What one ``--overflow`` policy keeps at a max length: records, samples, tokens, trainable tokens
    (and their fraction of all); ``applies`` is false (and the counts 0) where the run refuses the policy."""

    records: int
    samples: int
    tokens: int
    trainable_tokens: int
    trainable_fraction: float
    applies: bool | None = None

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class RawLine:
    """Raw inputs packed at one max length: what fits, rows and padding packed and unpacked, the row
    bounds, the row fill, and what each overflow policy keeps (drop, truncate, truncate-left, split)."""

    max_len: int
    samples_fit: int
    samples_too_long: int
    tokens: int
    rows: int
    rows_without_packing: int
    padding_tokens: int
    padding_tokens_without_packing: int
    padding_tokens_batch_padded: int
    fill: float
    lower_bound_l1: int
    lower_bound_l2: int
    rows_over_l2: int
    rows_over_l2_fraction: float
    row_fill_histogram: BinCounts
    policies: dict[str, PolicyKept]

    def to_dict(self) -> JSONObject:
        return record_dict(self)


@dataclass(frozen=True, kw_only=True)
class RawStats(_ByKey):
    """``packcli stats --json`` of raw inputs (``packcli.stats(inputs, max_len)``): the records read and
    their samples, tokens and lengths, and per max length (``max_lens``) what packing would give."""

    mode: str  # raw
    inputs: list[str]
    tokenizer: str
    cache: str
    records_read: int
    samples: int
    dropped: dict[str, int]
    turns_fixed: dict[str, int] | None = None
    empty_answers: int | None = None
    leading_answers: int | None = None
    tools_left_out: int | None = None
    reasoning: dict[str, int] | None = None
    tokens: int
    trainable_tokens: int
    sample_length: Distribution
    length_histogram: BinCounts
    batch_size: int
    max_lens: list[RawLine]
    # Messages as the core made them; text once a client named their options its way (cli, api).
    warnings: list[Message | str] | None = None

    def to_dict(self) -> JSONObject:
        return record_dict(self)
