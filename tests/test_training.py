"""The training side: rows read from Parquet or Arrow output, and a sampler that keeps --world-size balance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packcli.errors import UsageError
from packcli.train.checks import RankStepSampler, load_rows, step_order


def _batches(order: np.ndarray, batch_size: int) -> list[list[int]]:
    """The batches of ``order`` as a loader cuts them."""
    return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]


@pytest.mark.parametrize(("rows", "world", "batch"), [(21, 3, 2), (16, 4, 4), (10, 1, 3), (12, 2, 5)])
def test_step_order_shuffles_whole_steps(rows: int, world: int, batch: int) -> None:
    order = step_order(rows, world, batch, epoch=0, seed=7)
    steps = rows // world
    assert set(order.tolist()) == set(range(rows))
    if world > 1:  # the last batches filled with repeated steps, so that every batch is one rank's
        assert len(order) == -(-steps // batch) * batch * world
        assert all(len(b) == batch for b in _batches(order, batch))
    else:
        assert sorted(order.tolist()) == list(range(rows))
    batches = _batches(order, batch)
    for k in range(0, len(batches), world):
        group = batches[k : k + world]
        # Rank r's batch holds the r-th rows of the same steps as every other rank's batch.
        assert all(all(i % world == r for i in b) for r, b in enumerate(group))
        assert len({tuple(i // world for i in b) for b in group}) == 1
    assert step_order(rows, world, batch, epoch=0, seed=7).tolist() == order.tolist()
    assert step_order(rows, world, batch, epoch=1, seed=7).tolist() != order.tolist()
    plain = step_order(rows, world, batch, shuffle=False)
    assert [i // world for i in plain.tolist()[: min(batch, steps)]] == list(range(min(batch, steps)))


def test_step_order_refuses_rows_that_are_not_whole_steps() -> None:
    with pytest.raises(UsageError, match="10 rows are not whole steps of 4"):
        step_order(10, 4)
    with pytest.raises(UsageError, match="rank must be between 0 and 1"):
        RankStepSampler(10, 2, rank=2)


def test_accelerate_deals_each_rank_one_row_of_every_step() -> None:
    """What the Trainer does with a sampler: accelerate cuts it in batches and deals them to the ranks."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    rows, world, batch = 30, 3, 4
    sampler = RankStepSampler(rows, world, batch_size=batch, seed=1)
    sampler.set_epoch(2)
    per_rank = []
    for rank in range(world):
        shard = BatchSamplerShard(BatchSampler(sampler, batch, drop_last=False), world, rank)
        per_rank.append(list(shard))
    for rank, batches in enumerate(per_rank):
        assert all(i % world == rank for b in batches for i in b)
        assert set(i // world for b in batches for i in b) == set(range(rows // world))
        assert len(batches) == 3 and all(len(b) == batch for b in batches)  # 10 steps: 2 repeated
    for step_batches in zip(*per_rank, strict=True):  # the same steps at the same time on every rank
        assert len({tuple(i // world for i in b) for b in step_batches}) == 1
    # Without accelerate (torchrun, your own loop): rank r's rows only, one per step.
    mine = list(RankStepSampler(rows, world, rank=1, seed=1))
    assert len(mine) == len(RankStepSampler(rows, world, rank=1)) == 10
    assert sorted(mine) == list(range(1, rows, world))


def test_load_rows_reads_parquet_and_arrow_output(tmp_path: Path, chat_jsonl: Path, pack: Any) -> None:
    pack(chat_jsonl, "--max-len", "512", "-o", tmp_path / "pq", "--rows-per-shard", "3")
    pack(chat_jsonl, "--max-len", "512", "-o", tmp_path / "arrow", "--rows-per-shard", "3", "--output-format", "arrow")
    assert any(p.suffix == ".arrow" for p in (tmp_path / "arrow").iterdir())
    a, b = load_rows(tmp_path / "pq"), load_rows(tmp_path / "arrow")
    assert len(a) == len(b) > 3
    assert a.to_dict() == b.to_dict()
    with pytest.raises(Exception, match=r"no readable manifest\.json"):
        load_rows(tmp_path)
