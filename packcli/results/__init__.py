"""The typed records a run hands on: its summary, the manifest and its shard entries, the token store's
metadata and the rejects file's entries.

Each is a dataclass whose ``to_dict()`` is the JSON packcli writes (the same keys in the same order:
``--json``, ``manifest.json``, ``meta.json``, a rejects line) and whose ``from_dict()`` reads it back,
raising :class:`DamagedResult` (one line: what is missing) when a key it needs is not there. A field
that is ``None`` is left out of the JSON, as it was before it existed (a summary without ``split``, a
manifest written before ``max_token_id``), unless the type names it in ``NULLS`` (the summary's
``limit`` and ``output`` are written as null). The page that lists the keys
(docs/reference/summary-and-manifest.md) is checked against these fields by tests/test_docs.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, NotRequired, TypedDict

from packcli.errors import Message, Terms, python_term
from packcli.jsontypes import JSONObject, TemplateKwargs
from packcli.results.base import (
    IN_MEMORY,
    DamagedResult,
    JSONRecord,
    field_names,
    read_messages,
    record_dict,
    record_from_dict,
    required_fields,
)
from packcli.results.sections import DedupSummary, EvalSummary, MixSource, MixSummary
from packcli.results.stats import (
    BinCounts,
    Distribution,
    ImageStats,
    OutputStats,
    PairStats,
    PerRow,
    PolicyKept,
    RawLine,
    RawStats,
    TreeStats,
)

__all__ = [
    "REJECT_KEYS",
    "BinCounts",
    "CacheParts",
    "CachePruned",
    "Counts",
    "DamagedResult",
    "DedupSummary",
    "Distribution",
    "EncoderInfo",
    "EvalSummary",
    "FileDigest",
    "ImageRecord",
    "ImageStats",
    "Lost",
    "Manifest",
    "MixSource",
    "MixSummary",
    "OutputStats",
    "PairStats",
    "PartInfo",
    "PerRow",
    "PolicyKept",
    "ProcessorIdentity",
    "RawLine",
    "RawStats",
    "RejectEntry",
    "RunSummary",
    "Seconds",
    "Segment",
    "ShardEntry",
    "Split",
    "StageSeconds",
    "StoreMeta",
    "TokenizerIdentity",
    "TreeStats",
    "field_names",
    "required_fields",
]

# -- a sample's images -----------------------------------------------------------------------------


class ImageRecord(TypedDict, total=False):
    """One image of a sample, as the token store's image table (images.jsonl) and the rows record it:
    the file (``path``, with its ``stat`` stamp when read) or the image's ``bytes`` (``path`` None), its
    size [height, width], the processor's grid and tokens, and where its tokens are in the sample
    (``offset``, ``span``)."""

    path: str | None
    stat: Any  # the file's stamp when it was read (packcli.io.fingerprint.file_stamp), or None
    bytes: bytes
    size: list[int]
    grid: list[int]
    tokens: int
    offset: int
    span: int


# -- the tokenizer's identity ----------------------------------------------------------------------


class ProcessorIdentity(TypedDict, total=False):
    """An image-text run's processor, as the store and the manifest record it under the tokenizer's
    identity: its directory, family, image token and its id, sha256, and the image counts."""

    dir: str
    family: str
    image_token: str
    image_token_id: int | None
    sha256: str
    images: dict[str, int]  # samples, images, image_tokens, embedded (packcli.output.images.IMAGE_COUNTS)


class TokenizerIdentity(TypedDict, total=False):
    """What identifies the tokenizer and its chat template (packcli.tokenize.encoder.Encoder.identity):
    recorded in the store's meta.json and the manifest, part of the cache key. Keys are missing from
    entries made before they were recorded (hence not total)."""

    name: str
    sha256: str
    vocab_size: int
    vocab_sha256: str
    eos_token: str | None
    special_tokens: dict[str, str]
    special_token_ids: dict[str, int]
    chat_template: str
    chat_template_source: str  # tokenizer | file | packcli | default
    chat_template_sha256: str
    chat_template_generation_blocks: bool
    chat_template_kwargs: TemplateKwargs
    overridden: list[str]
    warnings: list[str]
    processor: ProcessorIdentity  # an image-text run's


# -- the run summary -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Split(JSONRecord):
    """What ``--overflow split`` did: records split, pieces made and left out (the store's counts), and
    what the plan cut or left out (in the summary only)."""

    pieces: int
    pieces_left_out: dict[str, int]
    records_split: int
    tokens_left_out: dict[str, int] = field(default_factory=dict)
    exchanges_cut: int | None = None  # exchanges too long for a row on their own, cut and kept
    cut_side: str | None = None
    pieces_dropped_by_plan: dict[str, int] | None = None

    WHAT: ClassVar[str] = "split"


@dataclass(frozen=True, kw_only=True)
class Lost(JSONRecord):
    """What did not reach the rows: records and tokens, each in all, as a fraction and by reason."""

    records: int
    records_fraction: float
    tokens: int
    tokens_fraction: float
    records_by_reason: dict[str, int]
    tokens_by_reason: dict[str, int]

    WHAT: ClassVar[str] = "lost"


@dataclass(frozen=True, kw_only=True)
class Seconds(JSONRecord):
    """Wall seconds of the run's three phases and in all."""

    tokenize: float
    plan: float
    write: float
    total: float

    WHAT: ClassVar[str] = "seconds"


@dataclass(frozen=True, kw_only=True)
class StageSeconds(JSONRecord):
    """Where a run's time went, by stage (docs/reference/summary-and-manifest.md); worker stages are sums.

    ``hash``, ``tokenize_wall``, ``summary``, ``finish`` and ``prune`` are 0 in a summary written before
    they were measured.
    """

    prepare: float
    hash: float = 0.0
    tokenize_wall: float = 0.0
    read: float
    decode: float
    tokenize: float
    store: float
    plan: float
    summary: float = 0.0
    write: float
    finish: float = 0.0
    prune: float = 0.0
    workers_cpu: float
    total: float

    WHAT: ClassVar[str] = "stage_seconds"


@dataclass(frozen=True, kw_only=True)
class CachePruned(JSONRecord):
    """What the cache size cap removed after the run."""

    entries: int
    bytes: int
    bytes_left: int
    max_size: int

    WHAT: ClassVar[str] = "cache_pruned"


@dataclass(frozen=True, kw_only=True)
class CacheParts(JSONRecord):
    """A token store assembled from the inputs' cache parts: what was found and what was tokenized."""

    parts_reused: int
    parts_made: int
    records_reused: int
    records_tokenized: int

    WHAT: ClassVar[str] = "cache_parts"


@dataclass(frozen=True, kw_only=True)
class EncoderInfo(JSONRecord):
    """The text encoder that made the tokens (packcli.tokenize.text_encoders): its name, why it is not the
    fast one (null when it is, or was not asked for), and the records whose masks the reference
    tokenizers made (added by the run that counts them). The fields in meta.json's (sorted) order, which
    the summary and the manifest keep."""

    NULLS: ClassVar[frozenset[str]] = frozenset({"fallback"})

    fallback: str | None = None
    name: str
    records_slow: int | None = None

    WHAT: ClassVar[str] = "encoder"


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """The summary of a pack run, as ``packcli pack --json`` prints it (``records_read == packed +
    sum(dropped)``, plus ``mix.records_left_out`` and ``eval.records`` when they are there). ``shards``,
    ``seconds`` and what follows are set once the output is written."""

    NULLS: ClassVar[frozenset[str]] = frozenset({"limit", "output"})

    tokenizer: str
    template: str
    template_source: str  # tokenizer | file | packcli | default
    task: str  # sft | preference | kto
    records_read: int
    limit: int | None  # the --limit given (written as null without one)
    packed: int
    samples: int
    dropped: dict[str, int]  # reason -> records
    truncated: int
    duplicated: int
    split: Split | None = None
    turns_fixed: dict[str, int] | None = None
    empty_answers: int
    # Conversations whose first message (after system ones) is a trained answer: an answer to nothing
    leading_answers: int = 0
    # Conversations with a tools list the chat template leaves out of the tokens (their calls trained unseen)
    tools_left_out: int = 0
    # Trained turns with reasoning and those the template leaves out (worker.REASONING_KEYS); None: no reasoning
    reasoning: dict[str, int] | None = None
    # --expand-turns: records expanded, the samples made of them, and their tokens beyond the records' own
    expanded: dict[str, int] | None = None
    # --prefix-tree: records made into trees, the trees, the expanded samples they hold, their tokens and
    # the plain expansion's (packcli.tokenize.trees.TREE_KEYS)
    trees: dict[str, int] | None = None
    tokens: int
    trainable_tokens: int
    rows: int
    max_len: int
    fill: float
    lower_bound_l1: int
    lower_bound_l2: int
    rows_over_l2: int
    rows_over_l2_fraction: float
    padding_tokens: int
    alignment_padding_tokens: int
    rows_without_packing: int
    padding_tokens_without_packing: int
    algorithm: str
    world_size: int
    rank_tokens: list[int]
    rank_token_spread: float
    cache: str  # hit | miss | off | rebuilt
    output: str | None  # None for a dry run (written as null)
    warnings: list[Message]  # each names options by the terms of the client that shows it
    lost: Lost
    dedup: DedupSummary | None = None  # --dedup exact
    mix: MixSummary | None = None  # --mix: the recipe, and per source what was asked and what was given
    eval: EvalSummary | None = None  # --eval-fraction/--eval-records: the records held out into eval/
    shards: int | None = None  # absent from a dry run's summary
    skipped_dirs: list[str] | None = None
    cache_pruned: CachePruned | None = None
    # A run whose token store was assembled from cache parts (packcli.store.parts): reused and tokenized.
    cache_parts: CacheParts | None = None
    # The text encoder that made the tokens: name, fallback (why not the fast one), records_slow.
    encoder: EncoderInfo | None = None
    seconds: Seconds | None = None
    stage_seconds: StageSeconds | None = None
    tokens_per_second: int | None = None

    def to_dict(self, terms: Terms = python_term) -> JSONObject:
        """The summary as JSON data; its warnings name options by ``terms`` (Python's names by default,
        the command line's flags for ``packcli pack --json``)."""
        return record_dict(self, terms)

    @classmethod
    def from_dict(cls, data: object) -> RunSummary:
        return record_from_dict(
            cls,
            data,
            "the summary",
            {
                "split": Split.from_dict,
                "lost": Lost.from_dict,
                "cache_pruned": CachePruned.from_dict,
                "cache_parts": CacheParts.from_dict,
                "dedup": DedupSummary.from_dict,
                "mix": MixSummary.from_dict,
                "eval": EvalSummary.from_dict,
                "encoder": EncoderInfo.from_dict,
                "seconds": Seconds.from_dict,
                "stage_seconds": StageSeconds.from_dict,
                "warnings": read_messages,
            },
        )

    def __getitem__(self, key: str) -> Any:
        """The value of a JSON key (``summary["fill"]``), as when the summary was a dict; KeyError when absent."""
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of a JSON key, or ``default`` when the summary has none."""
        return self.to_dict().get(key, default)


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
                "encoder": EncoderInfo.from_dict,
            },
        )

    @property
    def files(self) -> list[str]:
        """The shard files, in row order."""
        return [entry.file for entry in self.shards]


# -- the token store's meta.json -------------------------------------------------------------------


class FileDigest(TypedDict):
    """A store file's entry in meta.json (``files``): its size and sha256."""

    bytes: int
    sha256: str


class Segment(TypedDict):
    """A segment of a store's token files (``segments``): the prefix of its files' names and its tokens."""

    prefix: str
    tokens: int


class PartInfo(TypedDict):
    """A cache part's place in its input (``part``): its number, first record, records, whether it is
    its input's last, and (a part of an engine's cuts) the lines or records its reading passed.

    A part of a JSON lines file (keyed by it) also holds ``end``, the hash of the file's bytes from its
    start through the part's last record."""

    index: int
    first: int
    records: int
    last: bool
    units: NotRequired[int]
    end: NotRequired[str]


@dataclass(frozen=True, kw_only=True)
class StoreMeta:
    """A token store's ``meta.json``: how its tokens were made, the records' counts, and its files.

    Written with sorted keys (its checksum, ``meta_sha256``, is of that text less itself); a run that
    finds an entry made from other paths names its own in memory (``original_paths`` keeps the old).
    """

    tokenizer: TokenizerIdentity
    pad_id: int
    records_read: int
    dropped: dict[str, int]
    sources: list[dict[str, Any]]  # path, kind, format, unit of each input
    source_starts: list[int]  # the sample_index of each input's first record
    segments: list[Segment]
    files: dict[str, FileDigest]  # by file name
    meta_sha256: str
    made: dict[str, Any] | None = None
    split: Split | None = None
    turns_fixed: dict[str, int] | None = None
    empty_answers: int | None = None
    leading_answers: int | None = None
    tools_left_out: int | None = None
    reasoning: dict[str, int] | None = None
    expanded: dict[str, int] | None = None
    trees: dict[str, int] | None = None  # --prefix-tree: the trees made (TREE_KEYS)
    ruled_out_over_bytes: int | None = None
    ruled_out_max_len: int | None = None
    segment_root: str | None = None
    encoder: EncoderInfo | None = None  # name, fallback, records_slow (packcli.tokenize.text_encoders)
    original_paths: list[str] | None = None  # in memory only (see above)
    # A cache part (packcli.store.parts): its number, first record, records and whether it is its input's last.
    part: PartInfo | None = None

    def to_dict(self) -> JSONObject:
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> StoreMeta:
        return record_from_dict(cls, data, "meta.json", {"split": Split.from_dict, "encoder": EncoderInfo.from_dict})


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
