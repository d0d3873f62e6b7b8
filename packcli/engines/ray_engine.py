"""The Ray engine (``--engine ray``): tokenizing and writing on a Ray cluster, planning on the driver.

``pipeline.run_pack`` calls the two functions of this module (through ``RayEngine``) in place of the
local engine's, with the same
signatures and results:

- ``tokenize_to_store``: the driver reads the inputs into raw batches (the same reader as the local
  engine, so ``sample_index`` and line numbers are the same), puts them into Ray's object store, and a
  Ray Data ``map_batches`` over a pool of tokenizer actors decodes, normalises and tokenizes them (each
  actor loads the tokenizer once and runs the local engine's per-batch function). The results stream
  back to the driver in input order and go through the local engine's own accounting loop into the
  token store, so the store (arrays, token files, counts, rejects, errors) is the local one.
- ``write_output``: the plan is made on the driver from the lengths alone (``plan.make_plan``, as on
  one machine); each shard is then one Ray task that reads the plan and the store's per-sample arrays
  from the object store, reads its rows' tokens from the store's files by path, builds the rows with
  the default engine's row builder and writes the shard with ``shards.write_shard``, to a local
  directory or to a pyarrow filesystem URI (``s3://``, ``gs://``, ``file://``).

Writer tasks read the token store by path: on a local instance that is this machine's disk; on a
cluster of several machines the store (``--cache-dir``, or the output's parent without a cache) must be
on storage that every node mounts at the same path.

Ray is imported at the top of the module on purpose: without it, importing this module fails and the
pipeline tells the user how to install it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import ray

from packcli import ingest, worker, write
from packcli.cache import TokenStore
from packcli.config import PackConfig
from packcli.contract import Progress
from packcli.engines.ray_session import (
    RayEngineError,
    cluster_cpus,
    ensure_ray,
    quiet_ray_data,
    shutdown_if_started_here,
)
from packcli.engines.uri import check_uri_output, is_uri, make_dirs, write_manifest_uri
from packcli.errors import OutputError, PackcliError, raise_if_stopped
from packcli.plan import Plan
from packcli.shards import shard_name, write_shard
from packcli.sources import InputSource, RawBatch
from packcli.tokenize import Encoder

# Records per batch sent to a tokenizer actor (the reader's batches are cut to this size).
RAY_BATCH_RECORDS = 100
_PAYLOAD_SCHEMA = pa.schema([("batch_id", pa.int64()), ("payload", pa.large_binary())])


class TokenizeActor:
    """A Ray Data actor: loads the tokenizer once, then tokenizes raw batches with the local engine's code.

    Each input row is one raw batch (a pickled ``(RawBatch, format)`` job, exactly what the local engine
    hands its worker processes); each output row is that batch's pickled ``TokenizedBatch``. The settings
    are a class attribute (see ``_actor_class``), so the actor has no constructor arguments to keep.
    """

    settings: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        # One tokenizer thread per actor: the actors are the parallelism, as the local engine's processes are.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        settings = self.settings
        encoder = Encoder(settings["tokenizer"], settings["chat_template"], settings["options"])
        own, expected = encoder.identity(), settings["identity"]
        if (own["sha256"], own["chat_template_sha256"]) != (expected["sha256"], expected["chat_template_sha256"]):
            raise RayEngineError(
                f"the tokenizer or chat template on Ray node {ray.util.get_node_ip_address()} differs from the "
                "driver's; install the same tokenizer files on every node (or pass a Hub name)"
            )
        self.fn = settings["fn"]
        worker.use(encoder, settings["fields"], split=settings["split"])

    def __call__(self, table: pa.Table) -> pa.Table:
        ids = table.column("batch_id").to_pylist()
        payloads = table.column("payload").to_pylist()
        out = [pickle.dumps(self.fn(*pickle.loads(p)), protocol=pickle.HIGHEST_PROTOCOL) for p in payloads]
        return pa.Table.from_arrays(
            [pa.array(ids, pa.int64()), pa.array(out, pa.large_binary())], schema=_PAYLOAD_SCHEMA
        )


def _actor_class(fn: Callable[..., Any], config: PackConfig, encoder: Encoder) -> type[TokenizeActor]:
    """Return a TokenizeActor class that carries this run's settings."""
    settings = {
        "fn": fn,
        "tokenizer": _absolute_if_local(config.tokenizer),
        "chat_template": _absolute_if_local(config.chat_template),
        "options": ingest.encode_options(config),
        "fields": dict(config.fields),
        "split": ingest.split_rule(config),
        "identity": encoder.identity(),
    }
    return type("TokenizeActor", (TokenizeActor,), {"settings": settings})


def _absolute_if_local(path: str | None) -> str | None:
    """Tokenizer directories and template files as absolute paths: actors may run in another directory."""
    if path is not None and os.path.exists(os.path.expanduser(path)):
        return os.path.abspath(os.path.expanduser(path))
    return path


def _ray_map_ordered(config: PackConfig, encoder: Encoder) -> Callable[..., Iterator[Any]]:
    """Return the ``map_ordered`` for ``ingest.tokenize_to_store`` that runs the jobs on Ray, in job order."""

    def map_ordered(fn: Callable[..., Any], jobs: Iterator[tuple[Any, ...]], num_proc: int) -> Iterator[Any]:
        # The driver reads the inputs (fast, sequential, and what numbers the records), putting each raw
        # batch into the object store; a read error is raised only after the batches before it, so the
        # first problem in input order is the one reported.
        refs: list[Any] = []
        read_error: BaseException | None = None
        try:
            for job in _split_jobs(jobs):
                raise_if_stopped()
                payload = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
                block = pa.Table.from_arrays(
                    [pa.array([len(refs)], pa.int64()), pa.array([payload], pa.large_binary())],
                    schema=_PAYLOAD_SCHEMA,
                )
                refs.append(ray.put(block))
        except PackcliError as exc:
            read_error = exc
        if refs:
            yield from _tokenize_on_ray(refs, fn, config, encoder)
        if read_error is not None:
            raise read_error

    return map_ordered


def _split_jobs(jobs: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """Cut each raw batch into consecutive batches of at most ``RAY_BATCH_RECORDS`` records.

    Smaller batches spread over more actors and reach the driver sooner. The cut changes nothing in the
    store: the results of the pieces are consecutive and in order, as those of the whole batch are.
    """
    for job in jobs:
        batch, *rest = job
        if not isinstance(batch, RawBatch) or len(batch.items) <= RAY_BATCH_RECORDS:
            yield job
            continue
        for start in range(0, len(batch.items), RAY_BATCH_RECORDS):
            positions = batch.positions[start : start + RAY_BATCH_RECORDS]
            wanted = set(positions)
            piece = dataclasses.replace(
                batch,
                first_index=batch.first_index + start,
                items=batch.items[start : start + RAY_BATCH_RECORDS],
                positions=positions,
                errors=[e for e in batch.errors if e[0] in wanted],
            )
            yield (piece, *rest)


def _tokenize_on_ray(refs: list[Any], fn: Callable[..., Any], config: PackConfig, encoder: Encoder) -> Iterator[Any]:
    import ray.data  # here, not at the top: writer tasks import this module and need none of it

    actors = max(1, min(cluster_cpus(), len(refs)))
    context = copy.deepcopy(ray.data.DataContext.get_current())
    quiet_ray_data(context)
    with ray.data.DataContext.current(context):
        ds = _map_batches(ray.data.from_arrow_refs(refs), _actor_class(fn, config, encoder), actors)
        batches = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2))
        expected = 0
        try:
            while True:
                raise_if_stopped()
                try:
                    table = next(batches)
                except StopIteration:
                    break
                except ray.exceptions.RayError as exc:
                    raise _worker_error(exc) from exc
                for batch_id, payload in zip(
                    table.column("batch_id").to_pylist(), table.column("payload").to_pylist(), strict=True
                ):
                    if batch_id != expected:  # preserve_order guarantees this; never trade exactness for it
                        raise RuntimeError(f"Ray returned batch {batch_id} where batch {expected} was due")
                    expected += 1
                    yield pickle.loads(payload)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    if expected != len(refs):
        raise RuntimeError(f"Ray returned {expected} of {len(refs)} batches")


def _map_batches(ds: Any, actor: type[TokenizeActor], actors: int) -> Any:
    """``ds.map_batches`` over a pool of ``actors`` tokenizer actors, one raw batch per call.

    A lost actor is not restarted (``max_restarts=0``): the run fails with the worker's error instead of
    retrying a batch that may crash it again, and Ray does not log a warning per actor about restarts.
    Newer Ray deprecates passing it as a keyword; without it, Ray's default (restart) applies.
    """
    import ray.data

    kwargs: dict[str, Any] = {
        "batch_size": None,
        "batch_format": "pyarrow",
        "compute": ray.data.ActorPoolStrategy(size=actors),
        "num_cpus": 1,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return ds.map_batches(actor, max_restarts=0, **kwargs)
        except TypeError:
            return ds.map_batches(actor, **kwargs)


def _worker_error(exc: BaseException) -> PackcliError:
    """A packcli error raised in a worker keeps its message; anything else becomes one line."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, PackcliError) and not isinstance(cause, ray.exceptions.RayError):
            return cause
        cause = getattr(cause, "cause", None) or cause.__cause__
    text = str(exc).strip().splitlines()
    last = next((line.strip() for line in reversed(text) if line.strip()), type(exc).__name__)
    ours = re.match(r"packcli\.[\w.]+Error: (.+)", last)  # a packcli error that Ray kept only as text
    if ours:
        return RayEngineError(ours.group(1))
    return RayEngineError(f"a Ray worker failed ({last[:300]})")


def tokenize_to_store(
    config: PackConfig,
    sources: list[InputSource],
    formats: dict[str, str | None],
    encoder: Encoder,
    store_path: Path,
    progress: Progress,
) -> TokenStore:
    """Tokenize every record of the sources on Ray into a token store at ``store_path``.

    The accounting (counts, rejects, ``--on-error fail``, the store's metadata) is the local engine's
    own loop; only the mapping of raw batches to tokenized batches runs on the cluster.
    """
    ensure_ray(config)
    mapper = _ray_map_ordered(config, encoder)
    try:
        return ingest.tokenize_to_store(config, sources, formats, encoder, store_path, progress, mapper)
    except BaseException:
        shutdown_if_started_here()
        raise


# -- stage 3: write the shards on the cluster ------------------------------------------------------


def _shard_job(
    store: TokenStore,
    plan: Plan,
    config: PackConfig,
    shard: int,
    name: str,
    destination: str,
    pad_id: int,
) -> dict[str, Any]:
    """Build one shard's rows from the token store and write the shard; return its manifest entry.

    The rows come from the default engine's own row builder (``write.row_group_tables``), in the
    same row groups, so the shard's bytes are the same. On an I/O error, returns ``{"error": message}``
    (the default engine's message) instead of raising; the driver raises it.
    """
    per = config.rows_per_shard
    rows = plan.order.order[shard * per : (shard + 1) * per]
    try:
        with store.open_tokens() as reader:
            tables = write.row_group_tables(reader, store, plan, rows, config, pad_id)
            if not is_uri(destination):
                return write_shard(tables, Path(destination) / name, config.output_format, write.output_schema(config))
            from pyarrow import fs as pafs

            filesystem, base = pafs.FileSystem.from_uri(destination)
            with tempfile.TemporaryDirectory(prefix=".packcli-shard-") as tmp:
                local = Path(tmp) / name
                entry = write_shard(tables, local, config.output_format, write.output_schema(config))
                with open(local, "rb") as src, filesystem.open_output_stream(f"{base.rstrip('/')}/{name}") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
                return entry
    except OSError as exc:
        why = exc.strerror or exc
        return {"error": f"{config.output}: cannot write a shard ({why}); free disk space or choose another -o"}


_write_shard_task = ray.remote(num_cpus=1, max_retries=0)(_shard_job)


def write_output(
    config: PackConfig, store: TokenStore, plan: Plan, staged: Path, progress: Progress, pad_id: int
) -> list[dict[str, Any]]:
    """Write the planned rows as shards, one Ray task per shard; return the manifest's shard entries.

    Shards go into ``staged`` (a local directory), or straight to ``config.output`` when that is a
    filesystem URI (``s3://bucket/prefix``): there the caller writes ``manifest.json`` last, with
    ``write_manifest_uri``, as the marker that the output is complete.
    """
    try:
        ensure_ray(config)
        if is_uri(config.output):
            destination = config.output
            make_dirs(destination)
        else:
            destination = str(Path(staged).resolve())
        n_rows = len(plan.order.order)
        n_shards = max(1, -(-n_rows // config.rows_per_shard))
        # The plan and the store's per-sample arrays go into the object store once; every writer task
        # reads its shard's rows from them (tasks on one node share one copy). The store's path is
        # absolute: tasks may run in another directory.
        store_ref = ray.put(dataclasses.replace(store, path=Path(store.path).resolve()))
        plan_ref = ray.put(plan)
        window = 2 * cluster_cpus()
        entries: list[dict[str, Any] | None] = [None] * n_shards
        pending: dict[Any, int] = {}
        try:
            for k in range(n_shards):
                name = shard_name(k, n_shards, config.output_format)
                ref = _write_shard_task.remote(store_ref, plan_ref, config, k, name, destination, pad_id)
                pending[ref] = k
                if len(pending) >= window:
                    _collect(pending, entries, progress, n_rows, num_returns=1)
            while pending:
                _collect(pending, entries, progress, n_rows, num_returns=1)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
        return [e for e in entries if e is not None]
    finally:
        shutdown_if_started_here()


def _collect(
    pending: dict[Any, int], entries: list[dict[str, Any] | None], progress: Progress, n_rows: int, num_returns: int
) -> None:
    done: list[Any] = []
    while not done:  # in short steps, so that a stop request is seen while the tasks run
        raise_if_stopped()
        done, _ = ray.wait(list(pending), num_returns=num_returns, timeout=0.2)
    for ref in done:
        k = pending.pop(ref)
        try:
            entry = ray.get(ref)
        except ray.exceptions.RayError as exc:
            raise _worker_error(exc) from exc
        if "error" in entry:
            raise OutputError(entry["error"])
        entries[k] = entry
        progress("write", entry["rows"], n_rows)


# -- outputs on object stores ----------------------------------------------------------------------


class RayEngine:
    """Ray Data actors tokenize, the driver plans from lengths, Ray tasks write the shards (``--engine ray``)."""

    def tokenize_to_store(
        self,
        config: PackConfig,
        sources: list[Any],
        formats: dict[str, str | None],
        encoder: Encoder,
        store_path: Path,
        progress: Progress,
        rule_out_long: bool = False,
    ) -> TokenStore:
        # The early too-long rule needs the driver's renderer in every actor; the Ray engine tokenizes all.
        return tokenize_to_store(config, sources, formats, encoder, store_path, progress)

    def write_output(
        self, config: PackConfig, store: TokenStore, plan: Plan, staged: Path | None, progress: Progress, pad_id: int
    ) -> list[dict[str, Any]]:
        return write_output(config, store, plan, staged, progress, pad_id)  # type: ignore[arg-type]

    def check_uri_output(self, output: str, overwrite: bool) -> None:
        check_uri_output(output, overwrite)

    def write_manifest_uri(self, output: str, manifest: dict[str, Any]) -> None:
        write_manifest_uri(output, manifest)
