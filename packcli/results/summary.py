"""The run summary (``packcli pack --json``): ``RunSummary`` and its sections.

The sections the manifest and the token store's ``meta.json`` record too (``Split``, ``Lost``,
``EncoderInfo``) are here, beside those of the summary only: the run's seconds, by phase and by stage,
and what the cache gave and what its size cap removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from packcli.errors import Message, Terms, python_term
from packcli.jsontypes import JSONObject
from packcli.results.base import JSONRecord, read_messages, record_dict, record_from_dict
from packcli.results.sections import DedupSummary, EvalSummary, MixSummary, StepBalance


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
    """The text encoder that made the tokens (packcli.tokenize.encoders.text_encoders): its name, why it is not the
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
    # --world-size above 1: the steps' predicted idle fraction, as written and made by tokens or by cost
    step_balance: StepBalance | None = None
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
                "step_balance": StepBalance.from_dict,
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
