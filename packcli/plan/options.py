"""The options of the plan, built once per run from the run's options (``packcli.run.options.plan_options``)."""

from __future__ import annotations

from dataclasses import dataclass

from packcli.config.shapes import DEFAULT_MODEL


@dataclass(frozen=True)
class PlanOptions:
    """The options of the plan: row length, overflow policy, padding of samples, algorithm and order."""

    max_len: int
    sample_limit: int  # the most tokens a sample may have so that, padded, it fits in max_len
    overflow: str = "drop"
    cut_side: str = "right"  # the side a sample too long for a row is cut from
    pad_multiple: int = 1
    pad_offset: int = 0
    algorithm: str = "ffd"
    seed: int = 0
    world_size: int = 1
    rank_remainder: str = "drop"
    balance: str = "tokens"  # what the rows of a step have alike: tokens or compute (packcli.plan.balance)
    balance_model: str = DEFAULT_MODEL  # the model shape a row's cost is weighed for
