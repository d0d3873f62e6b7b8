"""What a row costs a training step, and how much of the ``--world-size`` steps' time ranks spend waiting.

A row's cost, in tokens' worth: its tokens plus, for each of its samples of L tokens, L^2 / K, with K
from the model's shape (``packcli.config.shapes``: params / (layers x d_model)). The tokens and
lengths are the samples' as packed (their padded lengths with ``--pad-to-multiple-of``; the padding
segments of ``--pad-to-max`` are no sample). A step of N rows with costs c_1..c_N takes N x max(c) of
GPU time, of which sum(c) is useful; over an output, the idle fraction is (the sum over steps of
N x max - sum) / (the sum over steps of N x max). ``--balance compute`` cuts the steps from the rows
sorted by cost (``packcli.plan.packing.order_rows``); ``step_balance`` reports the written steps' idle
fraction beside the figures of both ways of making them, ``written_step_balance`` the same of rows
read back from shards.

No I/O; ``math.fsum`` makes the idle fraction independent of the order of steps and rows, so that
the plan's figure and one recomputed from the shards (``packcli.report``) are the same number.
"""

from __future__ import annotations

import math

import numpy as np

from packcli.config.shapes import DEFAULT_MODEL, model_shape
from packcli.plan import packing
from packcli.plan.options import PlanOptions
from packcli.results import StepBalance

__all__ = [
    "balance_costs",
    "idle_fraction",
    "row_costs",
    "row_loads",
    "step_balance",
    "steps_by_cost_idle",
    "written_step_balance",
]


def row_loads(lengths: np.ndarray, row_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return each row's tokens and the sum of its samples' squared lengths (int64, exact).

    ``lengths`` are the samples' lengths grouped by row, row ``r`` holding ``lengths[row_start[r]:
    row_start[r + 1]]`` (an empty row: 0 and 0).
    """
    x = np.asarray(lengths, dtype=np.int64)
    start = np.asarray(row_start, dtype=np.int64)
    tokens = np.zeros(len(start) - 1, dtype=np.int64)
    squares = np.zeros(len(start) - 1, dtype=np.int64)
    filled = np.diff(start) > 0
    if filled.any():  # each filled row's sum runs to the next filled row's start: the empty ones hold nothing
        starts = start[:-1][filled]
        tokens[filled] = np.add.reduceat(x, starts)
        squares[filled] = np.add.reduceat(x * x, starts)
    return tokens, squares


def row_costs(tokens: np.ndarray, squares: np.ndarray, k: float) -> np.ndarray:
    """Return each row's cost, ``tokens + squares / k`` (float64)."""
    return np.asarray(tokens, dtype=np.float64) + np.asarray(squares, dtype=np.float64) / k


def balance_costs(options: PlanOptions, lengths: np.ndarray, row_start: np.ndarray) -> np.ndarray | None:
    """Return the rows' costs when ``--balance compute`` makes the steps (``order_rows``' ``row_costs``), else None.

    ``lengths`` are the samples' lengths as packed, grouped by row (``row_start``).
    """
    if options.balance != "compute" or options.world_size <= 1:
        return None
    tokens, squares = row_loads(lengths, row_start)
    return row_costs(tokens, squares, model_shape(options.balance_model).k)


def idle_fraction(costs: np.ndarray, world: int) -> float:
    """Return the idle fraction of rows in written order, steps of ``world`` consecutive rows.

    ``sum over steps (N x max - sum) / sum over steps (N x max)``; 0.0 for no rows. Raises ValueError
    when the rows are not whole steps.
    """
    c = np.asarray(costs, dtype=np.float64)
    if len(c) % world:
        raise ValueError(f"{len(c)} rows are not whole steps of {world}")
    if not len(c):
        return 0.0
    gpu = math.fsum((world * c.reshape(-1, world).max(axis=1)).tolist())
    return (gpu - math.fsum(c.tolist())) / gpu if gpu > 0 else 0.0


def steps_by_cost_idle(costs: np.ndarray, world: int) -> float:
    """Return the idle fraction of the same rows cut into steps by cost (``--balance compute``)."""
    return idle_fraction(np.sort(np.asarray(costs, dtype=np.float64))[::-1], world)


def step_balance(
    options: PlanOptions, lengths: np.ndarray, row_start: np.ndarray, order: packing.RowOrder
) -> StepBalance | None:
    """Return the steps' idle fraction as written, by tokens and by cost (None with one rank).

    ``lengths`` are the samples' lengths as packed, grouped by row (``row_start``); ``order`` the
    written order. The other way of making the steps is made again from the same rows and seed.
    """
    world = options.world_size
    if world <= 1:
        return None
    k = model_shape(options.balance_model).k
    tokens, squares = row_loads(lengths, row_start)
    costs = row_costs(tokens, squares, k)
    idle = idle_fraction(costs[order.order], world)
    if options.balance == "compute":
        plain = packing.order_rows(tokens, options.seed, world, options.rank_remainder)
        idle_tokens, idle_compute = idle_fraction(costs[plain.order], world), idle
    else:
        idle_tokens, idle_compute = idle, steps_by_cost_idle(costs[order.order], world)
    return StepBalance(
        balance=options.balance,
        model=options.balance_model,
        k=k,
        idle=round(idle, 6),
        idle_tokens=round(idle_tokens, 6),
        idle_compute=round(idle_compute, 6),
    )


def written_step_balance(
    world: int, recorded: StepBalance | None, tokens: np.ndarray, squares: np.ndarray
) -> StepBalance | None:
    """Return the steps' balance of rows as written (``packcli stats``), from their tokens and squares.

    ``recorded`` is the manifest's section: its model and how the steps were made (without one, an
    output made before it was recorded: 7b, by tokens). The written idle fraction and the one by cost
    are the rows' own; the one by tokens is the written one, or, for rows made by cost, the
    manifest's (the rows' order by tokens breaks ties by row ids the shards do not keep). None with
    one rank, or rows that are not whole steps.
    """
    if world <= 1 or len(tokens) % world:
        return None
    model = recorded.model if recorded is not None else DEFAULT_MODEL
    how = recorded.balance if recorded is not None else "tokens"
    k = recorded.k if recorded is not None else model_shape(model).k
    costs = row_costs(tokens, squares, k)
    idle = round(idle_fraction(costs, world), 6)
    idle_tokens = idle if how == "tokens" else recorded.idle_tokens if recorded is not None else None
    return StepBalance(
        balance=how,
        model=model,
        k=k,
        idle=idle,
        idle_tokens=idle_tokens,
        idle_compute=round(steps_by_cost_idle(costs, world), 6),
    )
