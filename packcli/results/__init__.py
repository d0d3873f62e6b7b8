"""The typed records a run hands on: its summary, the manifest and its shard entries, the token store's
metadata and the rejects file's entries.

Each is a dataclass whose ``to_dict()`` is the JSON packcli writes (the same keys in the same order:
``--json``, ``manifest.json``, ``meta.json``, a rejects line) and whose ``from_dict()`` reads it back,
raising :class:`DamagedResult` (one line: what is missing) when a key it needs is not there. A field
that is ``None`` is left out of the JSON, as it was before it existed (a summary without ``split``, a
manifest written before ``max_token_id``), unless the type names it in ``NULLS`` (the summary's
``limit`` and ``output`` are written as null). The page that lists the keys
(docs/reference/summary-and-manifest.md) is checked against these fields by tests/test_docs.py.

The types are in the package's modules, each re-exported here: ``summary`` (the run summary and the
sections it shares), ``manifest`` (the manifest and the rejects file), ``store`` (the token store's
meta.json, the tokenizer's identity, a sample's images), ``sections`` (dedup, mix, eval), ``stats``
(``packcli stats``) and ``base`` (what they share).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from packcli.results.base import (
    IN_MEMORY as IN_MEMORY,
    DamagedResult,
    JSONRecord as JSONRecord,
    field_names,
    read_messages as read_messages,
    record_dict as record_dict,
    record_from_dict as record_from_dict,
    required_fields,
)
from packcli.results.manifest import REJECT_KEYS, Counts, Manifest, RejectEntry, ShardEntry
from packcli.results.sections import DedupSummary, EvalSummary, MixSource, MixSummary, StepBalance
from packcli.results.store import (
    FileDigest,
    ImageRecord,
    PartInfo,
    ProcessorIdentity,
    Segment,
    StoreMade,
    StoreMeta,
    StoreSource,
    TokenizerIdentity,
)
from packcli.results.summary import (
    CacheParts,
    CachePruned,
    EncoderInfo,
    Lost,
    RunSummary,
    Seconds,
    Split,
    StageSeconds,
)

if TYPE_CHECKING:
    from packcli.results.stats import (
        BinCounts as BinCounts,
        Distribution as Distribution,
        ImageStats as ImageStats,
        OutputStats as OutputStats,
        PairStats as PairStats,
        PerRow as PerRow,
        PolicyKept as PolicyKept,
        RawLine as RawLine,
        RawStats as RawStats,
        TreeStats as TreeStats,
    )

# ``packcli stats``' types, imported when first asked for (``results.stats``: 6.5 ms of dataclasses that no
# other command uses).
_STATS = frozenset(
    {
        "BinCounts",
        "Distribution",
        "ImageStats",
        "OutputStats",
        "PairStats",
        "PerRow",
        "PolicyKept",
        "RawLine",
        "RawStats",
        "TreeStats",
    }
)


def __getattr__(name: str) -> Any:
    if name in _STATS:
        from packcli.results import stats

        return getattr(stats, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "StepBalance",
    "StoreMade",
    "StoreMeta",
    "StoreSource",
    "TokenizerIdentity",
    "TreeStats",
    "field_names",
    "required_fields",
]
