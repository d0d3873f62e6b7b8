"""The two types of a mix: its options (``MixOptions``: the sources' recipes, the measure, the plan it
feeds) and the mix chosen (``Mix``: the view of the store the plan packs, and what each source has and
gives). ``packcli.plan.mix`` chooses one, re-exporting both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packcli.plan.options import PlanOptions
from packcli.store.tokens import TokenStore


@dataclass(frozen=True)
class MixOptions:
    """The options of a mix: its sources' recipes, the measure they are given in, and the plan it feeds."""

    specs: list[tuple[str, str, float]]  # per source: its path, share or epochs, the value
    plan: PlanOptions  # the plan the mix feeds: the sample limit, overflow, padding, seed and ranks
    by: str = "tokens"  # records, tokens or trainable: what a share is a share of
    max_epochs: float = 1.0  # the most times a share may repeat its source
    task: str = "sft"

    @property
    def names(self) -> list[str]:
        """Each source's path as given."""
        return [path for path, _, _ in self.specs]


@dataclass
class Mix:
    """The chosen mix: the view of the store the plan packs, and what each source has and gives."""

    view: TokenStore  # the store's samples as mixed: chosen records, a repeated record's copies adjacent
    names: list[str]
    kinds: list[str]  # share | epochs
    values: list[float]
    inputs: list[list[str]]  # the input files each source resolved to
    ranges: list[list[list[int]]]  # per source, the [first, end) sample_index of each of its inputs
    available: np.ndarray  # per source: [records, tokens, trainable] that can be packed
    target: np.ndarray  # per source: the measure aimed at
    left_out: np.ndarray  # per source: [records, tokens, trainable] the mix leaves out
    repeats_in_same_row: int = 0
    measure: str = "tokens"
    size: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
