"""Stage 3: the planned rows built from the token store and written as shards, in parallel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packcli.config import PackConfig
from packcli.contract import IGNORE_INDEX, Progress, no_progress, shard_schema
from packcli.errors import OutputError, raise_if_stopped
from packcli.output.rows import (
    ROW_GROUP_ROWS,
    build_rows,
    shard_name,
    write_shard,
)
from packcli.plan import mix
from packcli.plan.planner import Plan
from packcli.procs import pool
from packcli.store.tokens import (
    TokenReader,
    TokenStore,
)


def output_schema(config: PackConfig) -> Any:
    """The columns the rows of ``config`` have: SHARD_SCHEMA and the optional columns it asks for."""
    optional = []
    if config.pad_multiple > 1:
        optional.append("seq_lengths_unpadded")
    if config.loss_weighting != "token":
        optional.append("loss_weights")
    if config.task in ("preference", "kto"):
        optional.append("sample_role")
    if config.mix:  # -- mixtures
        optional.append("source")
    return shard_schema(optional)


# Shard-writer state: set in the parent before the pool forks.
_WRITE: dict[str, Any] = {}


def row_group_tables(
    reader: TokenReader,
    store: TokenStore,
    plan: Plan,
    rows: np.ndarray,
    config: PackConfig,
    pad_id: int,
    progress: Progress = no_progress,
) -> Iterator[Any]:
    """Yield the planned rows ``rows`` (row ids, in write order) as tables of at most ROW_GROUP_ROWS rows."""
    counts = np.diff(plan.row_start)
    starts = store.starts
    roles = store.sample_role
    assert roles is not None  # TokenStore.__post_init__ fills it
    for start in range(0, len(rows), ROW_GROUP_ROWS):
        group = rows[start : start + ROW_GROUP_ROWS]
        samples_per_row = counts[group]
        first = np.cumsum(samples_per_row) - samples_per_row
        pick = np.repeat(plan.row_start[group], samples_per_row) + (
            np.arange(int(samples_per_row.sum()), dtype=np.int64) - np.repeat(first, samples_per_row)
        )
        store_rows = plan.store_rows[pick]
        ids, labels = reader.gather(starts[store_rows] + plan.skips[pick], plan.lengths[pick])
        if plan.skips[pick].any():
            # A sample cut on the left starts inside the record: its first token takes no loss either.
            firsts = np.cumsum(plan.lengths[pick]) - plan.lengths[pick]
            labels[firsts[plan.skips[pick] > 0]] = IGNORE_INDEX
        yield build_rows(
            ids,
            labels,
            plan.lengths[pick],
            samples_per_row,
            store.sample_index[store_rows],
            pad_to=config.max_len if config.pad_to_max else None,
            pad_id=pad_id,
            piece_index=store.piece_index[store_rows],
            pad_multiple=config.pad_multiple,
            pad_offset=config.pad_offset,
            loss_weighting=config.loss_weighting,
            sample_role=roles[store_rows] if config.task in ("preference", "kto") else None,
            source=mix.source_ids(store, store_rows) if config.mix else None,  # -- mixtures
        )
        progress("write", len(group), len(plan.order.order))
        raise_if_stopped()


def _write_one_shard(s: int, progress: Progress = no_progress) -> dict[str, Any]:
    config: PackConfig = _WRITE["config"]
    per = config.rows_per_shard
    path = _WRITE["staged"] / shard_name(s, _WRITE["n_shards"], config.output_format)
    store, plan = _WRITE["store"], _WRITE["plan"]
    with store.open_tokens() as reader:
        rows = plan.order.order[s * per : (s + 1) * per]
        tables = row_group_tables(reader, store, plan, rows, config, _WRITE["pad_id"], progress)
        return write_shard(tables, path, config.output_format, output_schema(config))


def write_output(
    config: PackConfig, store: TokenStore, plan: Plan, staged: Path, progress: Progress, pad_id: int
) -> list[dict[str, Any]]:
    """Write the planned rows as shards into ``staged``; return the manifest's shard entries.

    Shards are written in parallel by up to --num-proc processes; each is the same file whichever
    process writes it.
    """
    n_rows = len(plan.order.order)
    n_shards = max(1, -(-n_rows // config.rows_per_shard))
    workers = min(config.num_proc, n_shards)
    _WRITE.update(config=config, store=store, plan=plan, staged=staged, pad_id=pad_id, n_shards=n_shards)
    entries = []
    try:
        if workers <= 1:
            entries = [_write_one_shard(s, progress) for s in range(n_shards)]
        else:
            written = pool.map_ordered(_write_one_shard, ((s,) for s in range(n_shards)), workers)
            with contextlib.closing(written):  # stops the workers at once if this loop fails
                for entry in written:
                    entries.append(entry)
                    progress("write", entry["rows"], n_rows)
    except OSError as exc:
        raise OutputError(
            f"{config.output}: cannot write a shard ({exc.strerror or exc}); free disk space or choose another -o"
        ) from exc
    finally:
        _WRITE.clear()
    return entries
