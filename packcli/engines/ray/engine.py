"""The Ray engine (``--engine ray``): reading, tokenizing and writing on a Ray cluster; the driver handles lengths.

``pipeline.run_pack`` calls the two functions of this module (through ``RayEngine``) in place of the
local engine's, with the same signatures and results:

- ``tokenize_to_store``: the inputs are cut into parts (JSON lines by byte range, Parquet by row group,
  other sources whole: ``ray_parts``). A pool of tokenizer actors, one per CPU of the cluster, each
  loading the tokenizer once, reads its parts itself, tokenizes them with the local engine's per-batch
  function, and writes each part's tokens as one *segment* of the token store, where the store is (the
  store's directory, or under the output URI ``.../.packcli-tokens/``). The driver receives per
  part only the samples' metadata (relative index, length, trained count, first trained position,
  position, piece: 20 bytes a sample, 24 when records are split), the rejects and the segment's
  checksums; it numbers the parts' records (prefix sums of their counts) and runs the local engine's
  accounting loop (``ingest``), so counts, rejects, errors and the store's arrays are the local ones.
- ``write_output``: the plan is made on the driver from the lengths alone (``plan.make_plan``); each
  shard is written by one call to a tokenizer actor of the run (warm: its imports are done), or on a
  cache hit by one Ray task, which reads the plan and the store's per-sample arrays from the object store,
  reads its rows' tokens from the segments by range, builds the rows with the local engine's row
  builder and writes the shard with ``shards.write_shard``, to a local directory or to a pyarrow
  filesystem URI (``s3://``, ``gs://``, ``file://``).

No input byte and no token passes through the driver. What each node needs (see docs/ray.md): the
inputs at a URI or at the same path, and either storage for the output and token store that every
node mounts at the same path, or an output URI, where the token segments go too.

Ray is imported at the top of the module on purpose: without it, importing this module fails and the
pipeline tells the user how to install it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pickle
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray

import packcli.engines.ray.parts as ray_parts
from packcli.config import PackConfig
from packcli.contract import Progress, file_sha256
from packcli.engines.ray.session import (
    RayEngineError,
    cluster_cpus,
    ensure_ray,
    shutdown_if_started_here,
)
from packcli.errors import OutputError, PackcliError, raise_if_stopped
from packcli.io.fingerprint import file_blake2b
from packcli.io.sources import InputSource
from packcli.io.uri import check_uri_output, is_uri, join, make_dirs, write_manifest_uri
from packcli.output import write
from packcli.output.rows import shard_name, write_shard
from packcli.owned import owner_tag
from packcli.plan.planner import Plan
from packcli.store.integrity import DamagedStore, Digest, segment_files
from packcli.store.tokens import TokenStore
from packcli.tokenize import ingest, worker
from packcli.tokenize.encoder import Encoder

# Ray's own retries: a tokenizer actor that dies (a crashed or lost node) is restarted and its part run
# again, a writer task that dies is run again. Both are idempotent: a part's segment and a shard are
# written whole under a name of their own, so a second run overwrites the first.
ACTOR_RESTARTS = 2
TASK_RETRIES = 2

STOP_WAIT = 10.0  # seconds a failed run waits for its running parts before it kills their actors

# What the driver's code received from the cluster (bytes of the objects it fetched, and how many):
# the measure behind "the driver handles lengths, not tokens" (tests/test_ray.py checks it).
RECEIVED = {"bytes": 0, "objects": 0}
# The last tokenizing run in this process: seconds until every actor had loaded its tokenizer
# (start-up), parts, and the Ray nodes the parts ran on (benchmarks/bench_ray.py and the tests read it).
LAST_RUN: dict[str, Any] = {}
# The tokenizer actors of a run that has tokenized, kept to write its shards (no new worker processes).
_WARM: dict[str, list[Any]] = {}


def _kill(actors: list[Any]) -> None:
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a, no_restart=True)


def _fetch(ref: Any) -> Any:
    """``ray.get`` of an object that a task returns pickled (bytes), counted in RECEIVED."""
    try:
        data = ray.get(ref)
    except ray.exceptions.RayError as exc:
        raise _worker_error(exc) from exc
    RECEIVED["bytes"] += len(data)
    RECEIVED["objects"] += 1
    return pickle.loads(data)


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


# -- stage 1: read and tokenize on the cluster; the tokens stay there --------------------------------


class SegmentWriter:
    """Writes one part's tokens as a segment (two files) under a root that is a local path or a URI.

    The sha256 and size of each file are measured as it is written, for the store's meta.json.
    """

    def __init__(self, root: str, prefix: str) -> None:
        self.root, self.prefix = root, prefix
        self.names = segment_files(prefix)
        self.digests = (Digest(), Digest())
        self.tokens = 0
        self._files: list[Any] = []

    def write(self, ids: np.ndarray, labels: np.ndarray) -> None:
        if not len(ids):
            return
        if not self._files:
            self._files = [self._open(name) for name in self.names]
        for fh, digest, array in zip(self._files, self.digests, (ids, labels), strict=True):
            data = np.ascontiguousarray(array, dtype="<i4").tobytes()
            fh.write(data)
            digest.update(data)
        self.tokens += len(ids)

    def _open(self, name: str) -> Any:
        path = join(self.root, name)
        if is_uri(self.root):
            from pyarrow import fs as pafs

            filesystem, where = pafs.FileSystem.from_uri(path)
            filesystem.create_dir(where.rsplit("/", 1)[0], recursive=True)  # file:// needs it; S3 and GCS do not
            return filesystem.open_output_stream(where)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "wb")

    def close(self) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
        """Close the files; return the segment (None when the part kept no sample) and its files' entries."""
        for fh in self._files:
            fh.close()
        if not self.tokens:
            return None, {}
        entries = {name: digest.entry() for name, digest in zip(self.names, self.digests, strict=True)}
        return {"prefix": self.prefix, "tokens": self.tokens}, entries


class Tokenizer:
    """A tokenizer actor: loads the tokenizer and template once, then reads and tokenizes parts."""

    def __init__(self, settings: dict[str, Any]) -> None:
        # One tokenizer thread per actor: the actors are the parallelism, as the local engine's processes are.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        root = settings["root"]
        if not is_uri(root) and not os.path.isdir(root):
            raise RayEngineError(
                f"the token store {root} is not visible on Ray node {ray.util.get_node_ip_address()}; put "
                "--cache-dir and the output on storage every node mounts at the same path, or write to an "
                "output URI (-o s3://bucket/prefix), where the tokens go too"
            )
        encoder = Encoder(settings["tokenizer"], settings["chat_template"], settings["options"])
        own, expected = encoder.identity(), settings["identity"]
        if (own["sha256"], own["chat_template_sha256"]) != (expected["sha256"], expected["chat_template_sha256"]):
            raise RayEngineError(
                f"the tokenizer or chat template on Ray node {ray.util.get_node_ip_address()} differs from the "
                "driver's; install the same tokenizer files on every node (or pass a Hub name)"
            )
        worker.use(encoder, settings["fields"], split=settings["split"], fix_turns=settings["fix_turns"])
        encoder.long_text_bytes = settings.get("long_text_bytes")
        self.root = root
        self.batch_size = settings["batch_size"]

    def ready(self) -> bool:
        return True

    def write_shard(self, *args: Any) -> bytes:
        """Write one shard (see ``_shard_job``) once the parts are done: the actor is already warm."""
        return _pickled(_shard_job(*args))

    def run(self, part: ray_parts.Part) -> bytes:
        """Read and tokenize one part, write its tokens as a segment; return its metadata, pickled.

        A problem with the data (a read error, a packcli error while tokenizing) is returned, after
        the batches before it, for the driver to raise in input order; anything else fails the call.
        """
        began, cpu_began = time.perf_counter(), time.process_time()
        segment = SegmentWriter(self.root, f"segments/{part.number:06d}-")
        units = ray_parts.Units()
        keys = ("index", "lengths", "trainable", "first", "pos", "piece", "role")
        arrays: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        out: dict[str, Any] = {
            "rejects": [],
            "n_records": 0,
            "records_split": 0,
            "pieces_made": 0,
            "turn_fixes": [],
            "empty_answers": 0,
        }
        fixed: dict[str, int] = {}
        left_out: dict[str, int] = {}
        left_out_tokens: dict[str, int] = {}
        seconds: dict[str, float] = {"decode": 0.0, "tokenize": 0.0}
        unit, split, roles = "record", False, False
        error: PackcliError | None = None
        read = 0.0
        try:
            batches = ray_parts.read_part(part, self.batch_size, units)
            while True:
                t = time.perf_counter()
                batch = next(batches, None)
                read += time.perf_counter() - t
                if batch is None:
                    break
                result = worker.tokenize_batch(batch, part.fmt)
                segment.write(result.ids, result.labels)
                unit = result.unit
                out["n_records"] += result.n_records
                out["records_split"] += result.records_split
                out["pieces_made"] += result.pieces_made
                out["rejects"].extend(result.rejects)
                out["turn_fixes"].extend(result.turn_fixes)
                out["empty_answers"] += result.empty_answers
                for kind, n in result.turns_fixed.items():
                    fixed[kind] = fixed.get(kind, 0) + n
                for reason, n in result.pieces_left_out.items():
                    left_out[reason] = left_out.get(reason, 0) + n
                for reason, n in result.tokens_left_out.items():
                    left_out_tokens[reason] = left_out_tokens.get(reason, 0) + n
                for key in ("decode", "tokenize"):
                    seconds[key] += result.seconds.get(key, 0.0)
                split = split or result.piece_index is not None
                roles = roles or result.roles is not None
                n = len(result.lengths)
                arrays["index"].append(result.sample_index.astype(np.int32))
                arrays["lengths"].append(result.lengths)
                arrays["trainable"].append(result.trainable)
                arrays["first"].append(result.first_trained)
                arrays["pos"].append(result.positions)
                arrays["piece"].append(
                    np.zeros(n, np.int32) if result.piece_index is None else result.piece_index.astype(np.int32)
                )
                arrays["role"].append(np.zeros(n, np.int8) if result.roles is None else result.roles.astype(np.int8))
        except PackcliError as exc:
            error = exc
        seg, files = segment.close()
        joined = {k: np.concatenate(v) if v else np.zeros(0, np.int32) for k, v in arrays.items()}
        if not split:
            joined["piece"] = None  # type: ignore[assignment]  # all 0: not sent
        if not roles:
            joined["role"] = None  # type: ignore[assignment]  # not preference data: not sent
        seconds["read"] = read
        seconds["cpu"] = time.process_time() - cpu_began
        seconds["wall"] = time.perf_counter() - began
        out.update(
            arrays=joined,
            unit=unit,
            units=units.value,
            pieces_left_out=left_out,
            turns_fixed=fixed,
            tokens_left_out=left_out_tokens,
            seconds=seconds,
            segment=seg,
            files=files,
            error=error,
            node=ray.get_runtime_context().get_node_id(),
        )
        return _pickled(out)


@dataclasses.dataclass
class PartResult:
    """One part's result, numbered globally: what ``ingest``'s accounting loop takes from an engine."""

    source: str
    unit: str
    first_index: int
    n_records: int
    sample_index: np.ndarray
    lengths: np.ndarray
    trainable: np.ndarray
    first_trained: np.ndarray
    positions: np.ndarray
    piece_index: np.ndarray | None
    roles: np.ndarray | None
    rejects: list[dict[str, Any]]
    records_split: int
    pieces_made: int
    pieces_left_out: dict[str, int]
    turns_fixed: dict[str, int]
    turn_fixes: list[dict[str, Any]]
    empty_answers: int
    tokens_left_out: dict[str, int]
    seconds: dict[str, float]
    segment: dict[str, Any]
    segment_files: dict[str, dict[str, Any]]


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def _count_part(part: ray_parts.Part) -> bytes:
    return _pickled(ray_parts.count_part(part))


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def _hash_input(path: str) -> bytes:
    return _pickled(file_blake2b(path))


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def _hash_token_file(path: str) -> bytes:
    return _pickled(file_sha256(Path(path)))


def hash_files(config: PackConfig, files: list[str], cpus: float = 1) -> dict[str, str]:
    """The inputs' content hashes (for the cache key and the manifest), computed by tasks, one a file.

    ``cpus`` 0: tasks that need no free CPU, for the check after the read, while the tokenizer actors
    (kept warm for the shards) still hold every CPU of the cluster.
    """
    if not files:
        return {}
    ensure_ray(config)
    task = _hash_input if cpus == 1 else _hash_input.options(num_cpus=cpus)
    refs = [task.remote(f) for f in files]
    return {f: _fetch(ref) for f, ref in zip(files, refs, strict=True)}


def check_digests(config: PackConfig, directory: str, expected: dict[str, dict[str, Any]]) -> None:
    """Check the sha256 of a found cache entry's token files in tasks (the driver reads no token)."""
    ensure_ray(config)
    refs = {name: _hash_token_file.remote(os.path.join(directory, name)) for name in expected}
    for name, ref in refs.items():
        if _fetch(ref) != expected[name]["sha256"]:
            raise DamagedStore(f"{Path(directory) / name}: sha256 differs from meta.json (changed bytes)")


class ClusterTokenizing:
    """The ``remote`` of ``ingest.tokenize_to_store``: parts tokenized by actors, results in input order."""

    def __init__(
        self, config: PackConfig, sources: list[InputSource], formats: dict[str, str | None], encoder: Encoder,
        store_path: Path,
    ) -> None:  # fmt: skip
        self.config, self.sources, self.formats, self.encoder = config, sources, formats, encoder
        self.segment_root: str | None = None  # None: the segments are written into the store's directory
        if is_uri(config.output) and not config.dry_run:
            # The output's file system holds the tokens too: no node needs to see the driver's disk.
            name = store_path.name if config.cache else f"tokens-{owner_tag()}-{uuid.uuid4().hex[:8]}"
            self.segment_root = f"{config.output.rstrip('/')}/.packcli-tokens/{name}"
        self.actors: list[Any] = []
        self.pending: dict[Any, tuple[int, int]] = {}  # parts submitted, not yet fetched
        self.running: Any = None
        self.began = time.perf_counter()

    def settings(self, root: str) -> dict[str, Any]:
        config = self.config
        return {
            "root": root,
            "tokenizer": _absolute_if_local(config.tokenizer),
            "chat_template": _absolute_if_local(config.chat_template),
            "options": ingest.encode_options(config),
            "fields": dict(config.fields),
            "split": ingest.split_rule(config),
            "fix_turns": config.fix_turns,
            "identity": self.encoder.identity(),
            "batch_size": ingest.BATCH_SIZE,
            "long_text_bytes": ingest.long_text_bytes(config, self.encoder),
        }

    def parts(self) -> list[ray_parts.Part]:
        parts = ray_parts.make_parts(self.sources, self.formats, ray_parts.part_bytes(self.sources, cluster_cpus()))
        if self.config.limit is None:
            return parts
        # --limit N: the first N records over all sources. A first pass counts each part's records, so
        # that each part knows how many it reads; the parts after the N-th record are not read at all.
        counts = [_fetch(ref) for ref in [_count_part.remote(p) for p in parts]]
        limited, left = [], self.config.limit
        for part, count in zip(parts, counts, strict=True):
            if left <= 0:
                break
            limited.append(dataclasses.replace(part, max_records=left))
            left -= count
        return limited

    def results(self, directory: Path | None) -> Iterator[PartResult]:
        self.running = self._results(directory)
        return self.running

    def close(self) -> None:
        """Stop now, however the run ended: the pending parts are cancelled and the actors stopped."""
        if self.running is not None:
            self.running.close()
        self.stop()

    def _results(self, directory: Path | None) -> Iterator[PartResult]:
        root = self.segment_root or str(Path(directory).resolve())  # type: ignore[arg-type]
        parts = self.parts()
        n_actors = max(1, min(cluster_cpus(), len(parts)))
        actor = ray.remote(num_cpus=1, max_restarts=ACTOR_RESTARTS, max_task_retries=TASK_RETRIES)(Tokenizer)
        settings = self.settings(root)
        self.actors = [actor.remote(settings) for _ in range(n_actors)]
        # Start-up ends when every actor has loaded its tokenizer: the cluster's fixed cost, apart.
        for ref in [a.ready.remote() for a in self.actors]:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise _worker_error(exc) from exc
        ready_at = time.perf_counter()
        LAST_RUN.update(startup_seconds=ready_at - self.began, ready_at=ready_at, parts=len(parts), actors=n_actors)
        nodes: set[str] = set()
        LAST_RUN["nodes"] = nodes
        window = 2 * n_actors  # parts in flight (or done, waiting for the parts before them)
        pending: dict[Any, tuple[int, int]] = self.pending
        done: dict[int, dict[str, Any]] = {}
        load = [0] * n_actors
        submitted = 0
        index = 0  # records of the parts before (sample_index of the next part's first record)
        unit_base = 0  # lines or records of this source's parts before
        source_records = 0
        try:
            for k, part in enumerate(parts):
                while submitted < len(parts) and submitted < k + window:
                    a = load.index(min(load))
                    pending[self.actors[a].run.remote(parts[submitted])] = (submitted, a)
                    load[a] += 1
                    submitted += 1
                while k not in done:
                    raise_if_stopped()
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
                    for ref in ready:
                        i, a = pending.pop(ref)
                        load[a] -= 1
                        done[i] = _fetch(ref)
                out = done.pop(k)
                nodes.add(out.pop("node"))
                if out["n_records"]:
                    yield self._numbered(part, out, index, unit_base)
                index += out["n_records"]
                source_records += out["n_records"]
                unit_base += out["units"]
                if out["error"] is not None:
                    raise out["error"]
                if part.last_of_source:
                    if part.kind != "whole" and source_records == 0 and part.max_records != 0:
                        raise ray_parts.empty_source_error(part.source)
                    unit_base = source_records = 0
            # Every part is in: the actors, warm (imports done), write the shards next (write_output).
            _WARM["actors"], self.actors = self.actors, []
        finally:
            self.stop()  # parts still pending die with their actors

    def _numbered(self, part: ray_parts.Part, out: dict[str, Any], index: int, unit_base: int) -> PartResult:
        arrays = out["arrays"]
        for entry in (*out["rejects"], *out["turn_fixes"]):
            entry["sample_index"] += index
            entry["position"] += unit_base
        return PartResult(
            source=part.source.display,
            unit=out["unit"],
            first_index=index,
            n_records=out["n_records"],
            sample_index=arrays["index"].astype(np.int64) + index,
            lengths=arrays["lengths"],
            trainable=arrays["trainable"],
            first_trained=arrays["first"],
            positions=arrays["pos"] + np.int32(unit_base),
            piece_index=arrays["piece"],
            roles=arrays["role"],
            rejects=out["rejects"],
            records_split=out["records_split"],
            pieces_made=out["pieces_made"],
            pieces_left_out=out["pieces_left_out"],
            turns_fixed=out["turns_fixed"],
            turn_fixes=out["turn_fixes"],
            empty_answers=out["empty_answers"],
            tokens_left_out=out["tokens_left_out"],
            seconds=out["seconds"],
            segment=out["segment"],
            segment_files=out["files"],
        )

    def stop(self) -> None:
        """Stop the actors (they give their CPUs back, to the next run or to other jobs).

        Parts still queued are cancelled and the running ones (a part takes seconds) are let finish
        first, for at most STOP_WAIT seconds: an actor killed with calls in flight has Ray's driver print
        on standard output that it will retry them.
        """
        if self.pending and self.actors:
            refs = list(self.pending)
            for ref in refs:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT)
        self.pending.clear()
        _kill(self.actors)
        self.actors = []

    def discard(self) -> None:
        """Remove segments written under the output URI (a failed run, or a store that is not kept)."""
        if self.segment_root is not None:
            remove_uri_dir(self.segment_root)


def remove_uri_dir(uri: str) -> None:
    from pyarrow import fs as pafs

    with contextlib.suppress(OSError, ValueError):
        filesystem, where = pafs.FileSystem.from_uri(uri)
        filesystem.delete_dir(where)


def _absolute_if_local(path: str | None) -> str | None:
    """Tokenizer directories and template files as absolute paths: actors may run in another directory."""
    if path is not None and os.path.exists(os.path.expanduser(path)):
        return os.path.abspath(os.path.expanduser(path))
    return path


def _worker_error(exc: BaseException) -> PackcliError:
    """A packcli error raised in a worker keeps its message; anything else becomes one line."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, PackcliError) and not isinstance(cause, ray.exceptions.RayError):
            return cause
        cause = getattr(cause, "cause", None) or cause.__cause__
    text = str(exc).strip().splitlines()
    last = next((line.strip() for line in reversed(text) if line.strip()), type(exc).__name__)
    ours = re.search(r"packcli\.[\w.]+Error: (.+)", str(exc))  # a packcli error that Ray kept only as text
    if ours:
        return RayEngineError(ours.group(1).strip())
    return RayEngineError(f"a Ray worker failed ({last[:300]})")


def tokenize_to_store(
    config: PackConfig,
    sources: list[InputSource],
    formats: dict[str, str | None],
    encoder: Encoder,
    store_path: Path,
    progress: Progress,
    before_finish: Callable[[], None] | None = None,
) -> TokenStore:
    """Tokenize every record of the sources on Ray into a token store at ``store_path``.

    The accounting (counts, rejects, ``--on-error fail``, the store's metadata) is the local engine's
    own loop; the reading, tokenizing and token writing run on the cluster.
    """
    began = time.perf_counter()
    LAST_RUN.clear()
    _kill(_WARM.pop("actors", []))  # an earlier run's, never used for writing
    ensure_ray(config)
    remote = ClusterTokenizing(config, sources, formats, encoder, store_path)
    remote.began = began
    try:
        return ingest.tokenize_to_store(
            config, sources, formats, encoder, store_path, progress, remote=remote, before_finish=before_finish
        )
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            remote.pending.clear()  # stopping on request: at once, not after the running parts
        remote.close()
        remote.discard()
        shutdown_if_started_here()
        raise
    finally:
        remote.close()


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


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def _write_shard_task(*args: Any) -> bytes:
    return _pickled(_shard_job(*args))


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
        # reads its shard's rows from them (tasks on one node share one copy), and its rows' tokens
        # from the segments, by range. The store's path is absolute: tasks may run in another directory.
        store_ref = ray.put(dataclasses.replace(store, path=Path(store.path).resolve()))
        plan_ref = ray.put(plan)
        # The tokenizer actors of this run write the shards when there are some (one CPU each, their
        # imports done); else (a cache hit) one task a shard.
        actors = _WARM.pop("actors", [])
        window = 2 * (len(actors) or cluster_cpus())
        entries: list[dict[str, Any] | None] = [None] * n_shards
        pending: dict[Any, int] = {}
        try:
            for k in range(n_shards):
                name = shard_name(k, n_shards, config.output_format)
                args = (store_ref, plan_ref, config, k, name, destination, pad_id)
                run = actors[k % len(actors)].write_shard if actors else _write_shard_task
                ref = run.remote(*args)
                pending[ref] = k
                if len(pending) >= window:
                    _collect(pending, entries, progress, n_rows, num_returns=1)
            while pending:
                _collect(pending, entries, progress, n_rows, num_returns=1)
        finally:
            if not actors:
                for ref in pending:
                    ray.cancel(ref, force=True)
            _kill(actors)
        return [e for e in entries if e is not None]
    finally:
        t = time.perf_counter()
        shutdown_if_started_here()
        LAST_RUN["shutdown_seconds"] = time.perf_counter() - t


def _collect(
    pending: dict[Any, int], entries: list[dict[str, Any] | None], progress: Progress, n_rows: int, num_returns: int
) -> None:
    done: list[Any] = []
    while not done:  # in short steps, so that a stop request is seen while the tasks run
        raise_if_stopped()
        done, _ = ray.wait(list(pending), num_returns=num_returns, timeout=0.2)
    for ref in done:
        k = pending.pop(ref)
        entry = _fetch(ref)
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
        before_finish: Callable[[], None] | None = None,
    ) -> TokenStore:
        # The early too-long rule needs the driver's renderer in every actor; the Ray engine tokenizes all.
        return tokenize_to_store(config, sources, formats, encoder, store_path, progress, before_finish)

    def write_output(
        self, config: PackConfig, store: TokenStore, plan: Plan, staged: Path | None, progress: Progress, pad_id: int
    ) -> list[dict[str, Any]]:
        return write_output(config, store, plan, staged, progress, pad_id)  # type: ignore[arg-type]

    def hash_files(self, config: PackConfig, files: list[str]) -> dict[str, str]:
        return hash_files(config, files)

    def rehash_files(self, config: PackConfig, files: list[str]) -> dict[str, str]:
        return hash_files(config, files, cpus=0)

    def digest_checker(self, config: PackConfig) -> Callable[[str, dict[str, Any]], None]:
        return functools.partial(check_digests, config)

    def discard_store(self, store: TokenStore) -> None:
        """A store that is not kept (``--no-cache``): remove its segments where they are not in its directory."""
        root = store.meta.get("segment_root")
        if root:
            remove_uri_dir(root)

    def check_uri_output(self, output: str, overwrite: bool) -> None:
        check_uri_output(output, overwrite)

    def write_manifest_uri(self, output: str, manifest: dict[str, Any]) -> None:
        write_manifest_uri(output, manifest)
