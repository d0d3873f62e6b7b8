"""Stage 3: the planned rows built from the token store and written as shards, in parallel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packcli.contract import IGNORE_INDEX, Progress, no_progress
from packcli.errors import OUTPUT, OutputError, ShardTooLarge
from packcli.output.layout import RowLayout
from packcli.output.rows import (
    ROW_GROUP_ROWS,
    build_rows,
    shard_name,
    write_shard,
)
from packcli.plan import mix
from packcli.plan.planner import Plan
from packcli.procs import pool
from packcli.procs.stop import raise_if_stopped
from packcli.results import ShardEntry
from packcli.store.images import load_images
from packcli.store.nodes import TreeNodes
from packcli.store.tokens import (
    TokenReader,
    TokenStore,
)


@dataclass(frozen=True)
class ShardWriting:
    """What every shard writer needs: handed to the worker processes once, by the pool's initializer."""

    layout: RowLayout
    store: TokenStore
    plan: Plan
    staged: Path
    n_shards: int


def row_group_tables(
    reader: TokenReader,
    store: TokenStore,
    plan: Plan,
    rows: np.ndarray,
    layout: RowLayout,
    progress: Progress = no_progress,
) -> Iterator[Any]:
    """Yield the planned rows ``rows`` (row ids, in write order) as tables of at most ROW_GROUP_ROWS rows."""
    counts = np.diff(plan.row_start)
    starts = store.starts
    roles = store.sample_role
    assert roles is not None  # TokenStore.__post_init__ fills it
    table = load_images(store.path) if layout.images else None
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
            layout,
            piece_index=store.piece_index[store_rows],
            sample_role=roles[store_rows] if layout.sample_roles else None,
            source=mix.source_ids(store, store_rows) if layout.sources else None,
            images=[table.get(int(k), []) for k in store_rows] if table is not None else None,
            skips=plan.skips[pick],
            tree=_tree_nodes(store, store_rows) if layout.trees else None,
        )
        progress("write", len(group), len(plan.order.order))
        raise_if_stopped()


def _tree_nodes(store: TokenStore, store_rows: np.ndarray) -> TreeNodes:
    """The nodes of the stored samples ``store_rows`` (a store made with --prefix-tree keeps every sample's)."""
    if store.tree_nodes is None:
        raise AssertionError(f"{store.path}: the rows hold trees, and the token store has no tree nodes")
    return store.tree_nodes.select(store_rows)


def _write_one_shard(job: ShardWriting, s: int, progress: Progress = no_progress) -> ShardEntry:
    layout, store, plan = job.layout, job.store, job.plan
    per = layout.rows_per_shard
    path = job.staged / shard_name(s, job.n_shards, layout.output_format)
    with store.open_tokens() as reader:
        rows = plan.order.order[s * per : (s + 1) * per]
        tables = row_group_tables(reader, store, plan, rows, layout, progress)
        return write_shard(tables, path, layout.output_format, layout.schema())


@contextlib.contextmanager
def arrow_pool() -> Iterator[None]:
    """pyarrow's default allocator while the shards are written: jemalloc where pyarrow has it, else the
    system's; the one before put back after (a library call leaves its caller's as it was); the writers
    forked inside inherit it.

    pyarrow's own default, mimalloc, made the write half again as long (a worker builds a shard's next
    row group while a thread writes the last). This sets the pool pyarrow's Python side allocates from;
    the Parquet writer's page buffers come from the default that libarrow reads from
    ``ARROW_DEFAULT_MEMORY_POOL`` as it loads, which the command line sets (``packcli.cli.arrow_allocator``).
    17,545 conversations, ``--no-cache``, ``--num-proc 2``, the write's seconds over 5 runs each: 1.40-1.51
    with mimalloc, 1.19-1.42 with the system's pool here alone, 0.97-1.11 with it in both places. Each
    buffer is freed by the pool that made it, whatever the default is by then.
    """
    import pyarrow as pa

    before = pa.default_memory_pool()
    try:
        chosen = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without it (Windows)
        chosen = pa.system_memory_pool()
    pa.set_memory_pool(chosen)
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def write_output(
    layout: RowLayout, store: TokenStore, plan: Plan, staged: Path, progress: Progress, num_proc: int
) -> list[ShardEntry]:
    """Write the planned rows as shards into ``staged``; return the manifest's shard entries.

    Shards are written in parallel by up to ``num_proc`` processes; each is the same file whichever
    process writes it.
    """
    n_rows = len(plan.order.order)
    n_shards = max(1, -(-n_rows // layout.rows_per_shard))
    workers = min(num_proc, n_shards)
    job = ShardWriting(layout, store, plan, staged, n_shards)
    with arrow_pool():  # the writers forked below inherit it
        return _write_all(job, n_rows, progress, workers)


def _write_all(job: ShardWriting, n_rows: int, progress: Progress, workers: int) -> list[ShardEntry]:
    layout, n_shards = job.layout, job.n_shards
    entries: list[ShardEntry] = []
    try:
        if workers <= 1:
            entries = [_write_one_shard(job, s, progress) for s in range(n_shards)]
        else:
            written = pool.map_ordered(_write_one_shard, ((s,) for s in range(n_shards)), workers, context=job)
            with contextlib.closing(written):  # stops the workers at once if this loop fails
                for entry in written:
                    entries.append(entry)
                    progress("write", entry.rows, n_rows)
    except OSError as exc:
        raise OutputError(
            f"{layout.output}: cannot write a shard (",
            *(exc.parts if isinstance(exc, ShardTooLarge) else (str(exc.strerror or exc),)),
            "); free disk space or choose another ",
            OUTPUT,
        ) from exc
    return entries
