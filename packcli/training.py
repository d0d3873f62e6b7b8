"""Reading packed output for training: the rows in order (Parquet or Arrow), and a sampler that keeps
``--world-size`` balancing.

``packcli pack --world-size N`` writes rows in steps of N: rank ``r`` is meant to read the ``r``-th row
of every step, and the rows of a step have about the same number of tokens, so that no rank waits for
another. A shuffling sampler (``DataLoader(shuffle=True)``, the Trainer's default ``RandomSampler``)
mixes rows of all steps and undoes that. :class:`RankStepSampler` shuffles whole steps instead (per
epoch, seeded), so each rank still reads one row of each step, in a new step order every epoch.

Needs torch for the sampler (``pip install "packcli[torch]"``); :func:`load_rows` needs only datasets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packcli.contract import MANIFEST
from packcli.errors import OutputError, UsageError


def load_rows(directory: str | Path, cache_dir: str | None = None) -> Any:
    """Return the rows of a ``packcli pack`` output as a ``datasets.Dataset``, in the written order.

    Reads the shards the manifest lists, whatever ``--output-format`` wrote them (Parquet; Arrow,
    memory-mapped as it is; MDS and Megatron, read back as packcli rows in memory); ``cache_dir`` is
    where datasets converts Parquet.
    """
    from datasets import Dataset, concatenate_datasets

    root = Path(directory)
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        files = [root / entry["file"] for entry in manifest["shards"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OutputError(f"{root}: no readable {MANIFEST} ({exc}); pass a packcli pack output directory") from exc
    if not files:
        raise OutputError(f"{root}: the output holds no shard (a dry run?); pack it again")
    from packcli.shard_formats import format_of, read_shard

    if format_of(files[0]).name in ("mds", "megatron"):
        # Read back as packcli rows (in memory): these layouts are other trainers', not datasets' own.
        import pyarrow as pa
        from datasets.table import InMemoryTable

        return Dataset(InMemoryTable(pa.concat_tables([read_shard(f) for f in files])))
    parts = [
        Dataset.from_parquet(str(f), cache_dir=cache_dir) if f.suffix == ".parquet" else Dataset.from_file(str(f))
        for f in files
    ]
    return concatenate_datasets(parts) if len(parts) > 1 else parts[0]


def step_order(
    rows: int, world_size: int, batch_size: int = 1, epoch: int = 0, seed: int = 0, shuffle: bool = True
) -> np.ndarray:
    """Return the row order of one epoch: whole steps (shuffled), dealt out as batches rank by rank.

    The order is for a loader that hands out batches round-robin over the ranks (accelerate's, hence
    the Trainer's): each run of ``world_size`` batches holds, for rank ``r``, the ``r``-th rows of the
    same ``batch_size`` steps. When the steps are not a multiple of ``batch_size``, the first steps
    of the epoch's order are repeated to fill the last batches. With ``world_size`` 1 it is a plain
    seeded shuffle of the rows (nothing repeated).
    """
    if world_size < 1 or batch_size < 1:
        raise UsageError(f"world_size and batch_size must be at least 1, not {world_size} and {batch_size}")
    if rows % world_size:
        raise UsageError(
            f"{rows} rows are not whole steps of {world_size}: pass the --world-size the output was packed "
            "with (its manifest says), or pack it again with this one"
        )
    steps = np.arange(rows // world_size, dtype=np.int64)
    if shuffle:
        steps = np.random.default_rng([seed, epoch]).permutation(steps)
    if world_size > 1 and len(steps) % batch_size:
        # A loader cuts the order into batches of batch_size rows: the last batches are filled with
        # steps from the start of this epoch's order (as DistributedSampler repeats rows to even out).
        steps = np.resize(steps, -(-len(steps) // batch_size) * batch_size)
    ranks = np.arange(world_size, dtype=np.int64)[:, None]
    chunks = [(steps[i : i + batch_size] * world_size)[None, :] + ranks for i in range(0, len(steps), batch_size)]
    # Each chunk is world_size x batch_size: rank 0's batch, then rank 1's, ...
    return np.concatenate([c.ravel() for c in chunks]) if chunks else np.zeros(0, np.int64)


def _sampler_base() -> type:
    try:
        from torch.utils.data import Sampler
    except ImportError:  # the sampler needs torch; load_rows and step_order do not
        return object
    return Sampler


class RankStepSampler(_sampler_base()):  # type: ignore[misc]
    """A torch Sampler over packed rows that shuffles whole ``--world-size`` steps, once per epoch.

    - ``rank=None`` (the Trainer, accelerate): yields every row, in an order whose batches, dealt
      round-robin to the ranks, give rank ``r`` the ``r``-th row of each step (see :func:`step_order`).
      ``batch_size`` must be the per-device batch size.
    - ``rank=r`` (your own loop under torchrun, instead of ``DistributedSampler``): yields rank ``r``'s
      rows only, one per step.

    Call ``set_epoch(epoch)`` at each epoch for a new step order (the Trainer does).
    """

    def __init__(
        self,
        rows: int | Any,
        world_size: int,
        batch_size: int = 1,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.rows = rows if isinstance(rows, int) else len(rows)
        if rank is not None and not 0 <= rank < world_size:
            raise UsageError(f"rank must be between 0 and {world_size - 1}, not {rank}")
        step_order(self.rows, world_size, batch_size)  # refuses what cannot be split
        self.world_size, self.batch_size, self.rank = world_size, batch_size, rank
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.rank is not None:  # one row per step for this rank: no batches to fill
            order = step_order(self.rows, self.world_size, 1, self.epoch, self.seed, self.shuffle)
            order = order[order % self.world_size == self.rank]
        else:
            order = step_order(self.rows, self.world_size, self.batch_size, self.epoch, self.seed, self.shuffle)
        return iter(order.tolist())

    def __len__(self) -> int:
        steps = self.rows // self.world_size
        if self.rank is not None or self.world_size == 1:
            return steps
        return -(-steps // self.batch_size) * self.batch_size * self.world_size
