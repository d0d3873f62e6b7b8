"""The sections a summary and a manifest get from the plan's extra steps: ``--dedup exact``
(``DedupSummary``), ``--mix`` (``MixSummary``, a ``MixSource`` each), the eval split (``EvalSummary``)
and the ``--world-size`` steps' balance (``StepBalance``); ``packcli stats`` reports the last three too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from packcli.jsontypes import JSONObject
from packcli.results.base import DamagedResult, JSONRecord, record_dict, record_from_dict


@dataclass(frozen=True, kw_only=True)
class DedupSummary(JSONRecord):
    """``--dedup exact``: the records dropped as duplicates (counted in ``dropped`` too), in all and per input."""

    mode: str
    duplicates: int
    by_source: dict[str, int]

    WHAT: ClassVar[str] = "dedup"


@dataclass(frozen=True, kw_only=True)
class MixSource(JSONRecord):
    """One ``--mix`` source: its name, the inputs it resolved to and their ``[first, end)`` sample_index
    ranges; in the training summary also what was asked (``{"share"|"epochs": value}``), what the source
    had and what the rows hold (records, tokens, trainable_tokens; ``realised`` also samples), its
    epochs, repeats and what it left out. An eval manifest's source has the first three only."""

    name: str
    inputs: list[str]
    sample_index: list[list[int]]
    requested: dict[str, float] | None = None
    requested_share: float | None = None
    available: dict[str, int] | None = None
    target: float | None = None
    realised: dict[str, int] | None = None
    realised_share: dict[str, float] | None = None
    epochs: float | None = None
    repeats: int | None = None
    left_out: dict[str, int] | None = None

    WHAT: ClassVar[str] = "a mix source"


@dataclass(frozen=True, kw_only=True)
class MixSummary:
    """``--mix``: the recipe (measured ``by`` records, tokens or trainable, its seed and size) and per source
    what was asked and what was given; repeats, and the records the mix left out (counted in neither
    ``packed`` nor ``dropped``). An eval manifest's names the sources only (no size, nothing left out)."""

    by: str  # records | tokens | trainable
    seed: int
    size: float | None = None
    sources: list[MixSource]
    repeats: int
    repeats_in_same_row: int
    records_left_out: int | None = None

    def to_dict(self) -> JSONObject:
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> MixSummary:
        def sources(value: Any) -> list[MixSource]:
            if not isinstance(value, list):
                raise DamagedResult("mix.sources is not a list")
            return [MixSource.from_dict(s) for s in value]

        return record_from_dict(cls, data, "mix", {"sources": sources})


@dataclass(frozen=True, kw_only=True)
class EvalSummary(JSONRecord):
    """The eval split (``--eval-fraction``/``--eval-records``): the records held out into ``path``/, and
    how they were packed there (``by_source``: input -> records held out)."""

    path: str
    records: int
    packed: int
    dropped: dict[str, int]
    samples: int
    tokens: int
    trainable_tokens: int
    rows: int
    by_source: dict[str, int]

    WHAT: ClassVar[str] = "eval"


@dataclass(frozen=True, kw_only=True)
class StepBalance(JSONRecord):
    """``--world-size`` N: the steps' predicted idle fraction (``packcli.plan.balance``), as written and with
    the steps made each way: ``idle_tokens`` by tokens (without ``--balance compute``), ``idle_compute`` by
    cost (with it). A row's cost is its tokens + sum(L^2) / ``k`` over its samples; ``k`` is ``model``'s."""

    balance: str  # tokens | compute: how the written steps were made
    model: str  # the --balance-model the costs are weighed for
    k: float
    idle: float
    idle_tokens: float | None = None  # None: not known (stats of an output made by cost, without it recorded)
    idle_compute: float

    WHAT: ClassVar[str] = "step_balance"
