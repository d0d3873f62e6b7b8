"""The Ray engine's shard writing: one call a shard, on a warm tokenizer actor or in a Ray task.

Each call reads the plan and the store's per-sample arrays from the object store (put there once),
reads its rows' tokens from the token store's segments by range, builds the rows with the local
engine's row builder (``output.write.row_group_tables``) and writes the shard with
``output.rows.write_shard``, to a local directory or to a pyarrow filesystem URI (``s3://``, ``gs://``,
``file://``): the same bytes as the local engine's.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from packcli.contract import Progress
from packcli.engines.ray.session import TASK_RETRIES, RaySession, cluster_cpus, kill, pickled
from packcli.errors import OUTPUT, OutputError, Part
from packcli.io.uri import is_uri, make_dirs
from packcli.output.layout import RowLayout
from packcli.output.rows import shard_name, write_shard
from packcli.output.write import row_group_tables
from packcli.plan.planner import Plan
from packcli.procs.stop import raise_if_stopped
from packcli.results import ShardEntry
from packcli.store.tokens import TokenStore


@dataclass(frozen=True)
class ShardFailed:
    """A shard a worker could not write: the message the driver raises (an OutputError's parts)."""

    message: tuple[Part, ...]


def shard_job(
    store: TokenStore, plan: Plan, layout: RowLayout, shard: int, name: str, destination: str
) -> ShardEntry | ShardFailed:
    """Build one shard's rows from the token store and write the shard; return its manifest entry.

    The rows come from the default engine's own row builder (``row_group_tables``), in the same row
    groups, so the shard's bytes are the same. On an I/O error, returns a ``ShardFailed`` (the default
    engine's message) instead of raising; the driver raises it.
    """
    per = layout.rows_per_shard
    rows = plan.order.order[shard * per : (shard + 1) * per]
    try:
        with store.open_tokens() as reader:
            tables = row_group_tables(reader, store, plan, rows, layout)
            if not is_uri(destination):
                return write_shard(tables, Path(destination) / name, layout.output_format, layout.schema())
            from pyarrow import fs as pafs

            filesystem, base = pafs.FileSystem.from_uri(destination)
            with tempfile.TemporaryDirectory(prefix=".packcli-shard-") as tmp:
                local = Path(tmp) / name
                entry = write_shard(tables, local, layout.output_format, layout.schema())
                with open(local, "rb") as src, filesystem.open_output_stream(f"{base.rstrip('/')}/{name}") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
                return entry
    except OSError as exc:
        why = exc.strerror or exc
        return ShardFailed(
            (f"{layout.output}: cannot write a shard ({why}); free disk space or choose another ", OUTPUT)
        )


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def _write_shard_task(*args: Any) -> bytes:
    return pickled(shard_job(*args))


def write_shards(
    session: RaySession,
    layout: RowLayout,
    store: TokenStore,
    plan: Plan,
    staged: Path | None,
    progress: Progress,
    actors: list[Any],
) -> list[ShardEntry]:
    """Write the planned rows as shards, one call per shard; return the manifest's shard entries.

    Shards go into ``staged`` (a local directory), or straight to ``layout.output`` when that is a
    filesystem URI (``s3://bucket/prefix``). The shards are written by ``actors`` (the warm tokenizer
    actors of this run, one CPU each, their imports done), or without them (a cache hit) by one task a
    shard; the actors are killed when the shards are written.
    """
    session.ensure()
    if is_uri(layout.output):
        destination = layout.output
        make_dirs(destination)
    else:
        assert staged is not None  # a local output is written through its staging directory
        destination = str(Path(staged).resolve())
    n_rows = len(plan.order.order)
    n_shards = max(1, -(-n_rows // layout.rows_per_shard))
    # The plan and the store's per-sample arrays go into the object store once; every writer call
    # reads its shard's rows from them (tasks on one node share one copy), and its rows' tokens from the
    # segments, by range. The store's path is absolute: tasks may run in another directory.
    store_ref = ray.put(dataclasses.replace(store, path=Path(store.path).resolve()))
    plan_ref = ray.put(plan)
    window = 2 * (len(actors) or cluster_cpus())
    entries: list[ShardEntry | None] = [None] * n_shards
    pending: dict[Any, int] = {}
    try:
        for k in range(n_shards):
            name = shard_name(k, n_shards, layout.output_format)
            args = (store_ref, plan_ref, layout, k, name, destination)
            run = actors[k % len(actors)].write_shard if actors else _write_shard_task
            pending[run.remote(*args)] = k
            if len(pending) >= window:
                _collect(session, pending, entries, progress, n_rows)
        while pending:
            _collect(session, pending, entries, progress, n_rows)
    finally:
        if not actors:
            for ref in pending:
                ray.cancel(ref, force=True)
        kill(actors)
    return [e for e in entries if e is not None]


def _collect(
    session: RaySession, pending: dict[Any, int], entries: list[ShardEntry | None], progress: Progress, n_rows: int
) -> None:
    done: list[Any] = []
    while not done:  # in short steps, so that a stop request is seen while the tasks run
        raise_if_stopped()
        done, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
    for ref in done:
        k = pending.pop(ref)
        entry: ShardEntry | ShardFailed = session.fetch(ref)
        if isinstance(entry, ShardFailed):
            raise OutputError(*entry.message)
        entries[k] = entry
        progress("write", entry.rows, n_rows)
