"""The pack run: read, normalise, tokenize (in worker processes), plan, write. Returns the summary."""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packcli import __version__, packing, procs, safety
from packcli.bounds import max_token_bytes, rule_out_too_long
from packcli.cache import (
    DamagedStore,
    TokenReader,
    TokenStore,
    TokenStoreWriter,
    cache_key,
    default_cache_dir,
    find_store,
)
from packcli.config import PackConfig
from packcli.contract import Progress, no_progress
from packcli.errors import InputError, OutputError, PackcliError, RecordError, UsageError, raise_if_stopped
from packcli.formats import Sample, detect_format, normalize
from packcli.records import check_sample, too_deep
from packcli.shards import (
    ROW_GROUP_ROWS,
    build_rows,
    shard_name,
    write_manifest,
    write_shard,
)
from packcli.sources import InputSource, RawBatch, count_records, fingerprint, read_batches, resolve_inputs
from packcli.tokenize import EncodeOptions, Encoder, tokenizer_fingerprint

# Reasons a record is left out by policy: always counted, never an error. Every other reason is bad
# data, which stops the run unless --on-error skip.
POLICY_DROPS = frozenset(
    {
        "empty",
        "empty_conversation",
        "no_assistant_turn",
        "nothing_to_train",
        "too_long",
        "nothing_to_train_after_truncation",
        "world_size_remainder",
    }
)
BATCH_SIZE = 256
# Bumped whenever the same inputs and options would give other tokens or labels, so the cache misses.
ENCODING_RULES = 2
REJECT_RECORD_CHARS = 100_000


def encode_options(config: PackConfig) -> EncodeOptions:
    """Return the options that decide a sample's tokens and labels."""
    return EncodeOptions(config.train_on, config.add_eos, EncodeOptions.kwargs_items(config.template_kwargs))


@dataclass
class TokenizedBatch:
    """A worker's output for one RawBatch: kept samples as flat arrays, and the rejected records."""

    source: str
    unit: str  # what positions count: line or record
    first_index: int
    n_records: int
    sample_index: np.ndarray
    lengths: np.ndarray
    trainable: np.ndarray
    first_trained: np.ndarray
    positions: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    rejects: list[dict[str, Any]] = field(default_factory=list)


# Worker state: set in the parent before the pool forks, so workers start without loading anything.
_STATE: dict[str, Any] = {}


def _tokenize_batch(batch: RawBatch, fmt: str | None) -> TokenizedBatch:
    encoder: Encoder = _STATE["encoder"]
    fields: dict[str, str] = _STATE["fields"]
    errors = {pos: (reason, detail) for pos, reason, detail in batch.errors}
    samples: list[Any] = []
    raws: list[Any] = []
    for item, pos in zip(batch.items, batch.positions, strict=True):
        raws.append(item)
        try:
            if pos in errors:
                raise RecordError(*errors[pos])
            record = _parse_line(item) if batch.raw_lines else item
            record_format = fmt or detect_format(record, fields)
            if record_format is None:
                keys = ", ".join(map(str, record)) if isinstance(record, dict) else type(record).__name__
                raise RecordError("unknown_format", f"no known record format fits the fields ({keys})")
            sample = normalize(record, record_format, fields)
            check_sample(sample)
            if "rule_out" in _STATE:
                rule_out_too_long(sample, *_STATE["rule_out"], render=_STATE["render"])
            samples.append(sample)
        except RecordError as err:
            samples.append(err)
    results = encoder.encode_batch(samples)
    kept_index, kept_pos, ids, labels, rejects = [], [], [], [], []
    for k, result in enumerate(results):
        index = batch.first_index + k
        if isinstance(result, RecordError):
            rejects.append(_reject(index, batch.source, batch.positions[k], result, raws[k], batch.raw_lines))
            continue
        kept_index.append(index)
        kept_pos.append(batch.positions[k])
        ids.append(result[0])
        labels.append(result[1])
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int32, count=len(ids))
    flat_ids = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    flat_labels = np.concatenate(labels) if labels else np.zeros(0, np.int32)
    trainable, first_trained = _label_stats(flat_labels, lengths)
    return TokenizedBatch(
        source=batch.source,
        unit="line" if batch.raw_lines else "record",
        first_index=batch.first_index,
        n_records=len(batch.items),
        sample_index=np.array(kept_index, dtype=np.int64),
        lengths=lengths,
        trainable=trainable,
        first_trained=first_trained,
        positions=np.array(kept_pos, dtype=np.int32),
        ids=flat_ids,
        labels=flat_labels,
        rejects=rejects,
    )


def _label_stats(labels: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return each sample's count of trained tokens and the position of its first trained token.

    Every sample has at least one trained token (samples without are rejected before).
    """
    if not len(lengths):
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    trained = labels != -100
    counts = np.add.reduceat(trained.astype(np.int64), starts).astype(np.int32)
    hits = np.flatnonzero(trained)
    owner = np.searchsorted(starts, hits, side="right") - 1
    _, first_hit = np.unique(owner, return_index=True)
    return counts, (hits[first_hit] - starts).astype(np.int32)


def _parse_line(line: bytes) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError("invalid_utf8", f"byte {exc.start} of the line is not UTF-8; re-encode the file") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError("invalid_json", f"invalid JSON ({exc.msg} at column {exc.colno})") from exc
    except RecursionError as exc:  # the decoder recurses per nesting level
        raise too_deep() from exc


def _reject(index: int, source: str, position: int, err: RecordError, raw: Any, raw_lines: bool) -> dict[str, Any]:
    if raw_lines and isinstance(raw, bytes):
        record: Any = raw.decode("utf-8", errors="replace").rstrip("\n")
    else:
        record = raw
    text = record if isinstance(record, str) else _record_text(record)
    return {
        "sample_index": index,
        "source": source,
        "position": position,
        "unit": "line" if raw_lines else "record",
        "reason": err.reason,
        "detail": err.detail,
        "record": text[:REJECT_RECORD_CHARS],
    }


def _record_text(record: Any) -> str:
    """The record as JSON text for the rejects file, even when it cannot be written as UTF-8 as is."""
    try:
        text = json.dumps(record, ensure_ascii=False, default=str)
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: keep it escaped, as it was in the input
        text = json.dumps(record, default=str)
    except RecursionError:
        text = "(nested too deep to show)"
    return text


def _where(source: str, unit: str, position: int) -> str:
    return f"{source} {unit} {position}"


# -- stage 1: tokenize into the token store ---------------------------------------------------------


def _sniff_format(source: InputSource, fields: dict[str, str]) -> tuple[str | None, str | None]:
    """Return the record format of a source, from the fields of its first readable records.

    When none of them could be parsed at all, also return why the first one could not (where and
    what), since that, not the format, is the problem to report.
    """
    first_error = None
    parsed = False
    for batch in read_batches([source], batch_size=50):
        errors = {pos: detail for pos, _, detail in batch.errors}
        for item, pos in zip(batch.items, batch.positions, strict=True):
            try:
                if pos in errors:
                    raise RecordError("", errors[pos])
                record = _parse_line(item) if batch.raw_lines else item
            except RecordError as err:
                unit = "line" if batch.raw_lines else "record"
                first_error = first_error or f"{_where(source.display, unit, pos)}: {err.detail}"
                continue
            parsed = True
            fmt = detect_format(record, fields)
            if fmt is not None:
                return fmt, None
        break
    return None, None if parsed else first_error


def _init_worker(parent_pid: int) -> None:
    # One tokenizer thread per worker process: the processes are the parallelism. This also keeps the
    # Rust thread pool from being used across fork, which can deadlock when the parent already used it.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Die with the parent, take SIGTERM by default, ignore Ctrl-C (the parent stops the workers).
    procs.init_worker(parent_pid)


def _result(future: Future[Any]) -> Any:
    # Wait in short steps, so that a stop request is seen while a worker is busy.
    while True:
        raise_if_stopped()
        try:
            return future.result(timeout=0.2)
        except TimeoutError:
            continue
        except BrokenProcessPool as exc:
            raise PackcliError(
                "a worker process died (killed by a signal or out of memory); "
                "run again, with a lower --num-proc if memory is short"
            ) from exc


def _map_ordered(fn: Callable[..., Any], jobs: Iterator[tuple[Any, ...]], num_proc: int) -> Iterator[Any]:
    """Run ``fn`` over jobs, in worker processes when num_proc > 1, yielding results in job order.

    At most a few batches per worker are in flight, so memory does not grow with the input.
    """
    # Never more workers than jobs: the first num_proc jobs are read before any process starts.
    first = list(itertools.islice(jobs, num_proc)) if num_proc > 1 else []
    num_proc = min(num_proc, len(first)) if num_proc > 1 else 1
    jobs = itertools.chain(first, jobs)
    if num_proc <= 1:
        for job in jobs:
            raise_if_stopped()
            yield fn(*job)
        return
    executor = procs.start_pool(num_proc, multiprocessing.get_context("fork"), _init_worker)
    pending: deque[Future[Any]] = deque()
    try:
        for job in jobs:
            raise_if_stopped()
            pending.append(procs.submit(executor, fn, *job))
            if len(pending) >= 2 * num_proc + 1:
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())
    except BaseException:
        # Stopping (an error, a signal, or the consumer giving up): do not wait for work in flight.
        procs.stop_pool(executor)
        raise
    procs.close_pool(executor)


def tokenize_to_store(
    config: PackConfig,
    sources: list[InputSource],
    formats: dict[str, str | None],
    encoder: Encoder,
    store_path: Path,
    progress: Progress,
    map_ordered: Callable[..., Iterator[Any]] | None = None,
    rule_out_long: bool = False,
) -> TokenStore:
    """Tokenize every record of the sources into a token store at ``store_path``.

    ``map_ordered(fn, jobs, num_proc)`` runs the batches and yields their results in order: worker
    processes here by default; another engine passes its own (the Ray engine runs them on a cluster).
    With ``rule_out_long``, records that certainly have more than --max-len tokens are dropped as
    too_long before tokenizing (see packcli.bounds); the store then lacks them, which its meta records.
    """
    map_ordered = map_ordered or _map_ordered
    _STATE.update(encoder=encoder, fields=config.fields)
    ruled_out_bytes = _arm_rule_out(config, encoder) if rule_out_long else None
    where, fix = _store_where_fix(config, store_path)
    writer = TokenStoreWriter(store_path, fix, where)
    counts: Counter[str] = Counter()
    records = 0
    rejects_path = writer.tmp / "rejects.jsonl"
    starts: dict[str, int] = {}
    units: dict[str, str] = {}
    counted = [count_records(s) for s in sources]
    total = None if None in counted else sum(counted)  # type: ignore[arg-type]
    try:
        with _open_for_writing(rejects_path, where, fix) as rejects_file:
            jobs = ((batch, formats[batch.source]) for batch in read_batches(sources, BATCH_SIZE))
            for result in map_ordered(_tokenize_batch, jobs, config.num_proc):
                records += result.n_records
                starts.setdefault(result.source, result.first_index)
                units.setdefault(result.source, result.unit)
                for reject in result.rejects:
                    if reject["reason"] == "too_long" and config.overflow == "error":
                        where_record = _where(reject["source"], reject["unit"], reject["position"])
                        raise InputError(
                            f"{where_record}: {reject['detail']}; raise --max-len or pass --overflow drop or truncate"
                        )
                    if reject["reason"] not in POLICY_DROPS and config.on_error == "fail":
                        where = _where(reject["source"], reject["unit"], reject["position"])
                        raise InputError(
                            f"{where}: {reject['detail']}; fix the record, or pass --on-error skip to skip bad records"
                        )
                    counts[reject["reason"]] += 1
                    _write_line(rejects_file, json.dumps(reject, ensure_ascii=False), where, fix)
                writer.add(
                    result.sample_index,
                    result.lengths,
                    result.ids,
                    result.labels,
                    result.trainable,
                    result.first_trained,
                    result.positions,
                )
                progress("tokenize", result.n_records, total)
        pad_id = encoder.tokenizer.pad_token_id
        meta = {
            "tokenizer": encoder.identity(),
            "pad_id": pad_id if pad_id is not None else (encoder.eos_id or 0),
            "records_read": records,
            "dropped": dict(sorted(counts.items())),
            "sources": [
                {
                    "path": s.display,
                    "kind": s.kind,
                    "format": formats[s.display],
                    "unit": units.get(s.display, "record"),
                }
                for s in sources
            ],
            "source_starts": [starts.get(s.display, records) for s in sources],
        }
        if ruled_out_bytes is not None and counts["too_long"]:
            # Records over this many bytes were left out untokenized: only runs whose limit is no
            # higher may use this store (see _cached_store).
            meta["ruled_out_over_bytes"] = ruled_out_bytes
            meta["ruled_out_max_len"] = config.max_len
        return writer.finish(meta)
    except BaseException:
        writer.abort()
        raise
    finally:
        _STATE.clear()


def _arm_rule_out(config: PackConfig, encoder: Encoder) -> int | None:
    """Set up the workers' early too-long rule; return its byte limit (None: this tokenizer has no bound)."""
    token_bytes = max_token_bytes(encoder.backend.to_str())
    if token_bytes is None:
        return None

    def render(sample: Sample) -> str:
        # Exactly the text the encoder renders for a conversation (as in Encoder._chat_spans): the
        # bound holds for the text that is encoded, so it must be that text.
        kwargs = encoder.template_kwargs | (sample.template_kwargs or {})
        return encoder.render(encoder._prepare(sample), tools=sample.tools, kwargs=kwargs)[0]

    _STATE.update(rule_out=(config.max_len, token_bytes), render=render)
    return config.max_len * token_bytes


def _store_where_fix(config: PackConfig, store_path: Path) -> tuple[Path, str]:
    """Which path to name, and what to do, when the token store cannot be written.

    The store is the cache entry, or scratch space inside the output's staging directory (a
    temporary directory for a dry run): the message names the path the user chose.
    """
    if config.cache:
        return store_path.parent, "choose a writable --cache-dir with free space, or pass --no-cache"
    if config.dry_run:
        return Path(tempfile.gettempdir()), "free disk space there or set TMPDIR"
    return Path(config.output), "free disk space or choose another -o"


@contextlib.contextmanager
def _open_for_writing(path: Path, where: Path, fix: str) -> Iterator[Any]:
    try:
        fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise OutputError(f"{where}: cannot write the token store ({exc.strerror or exc}); {fix}") from exc
    try:
        yield fh
    finally:
        with contextlib.suppress(OSError):  # a failed flush was reported by the write that failed
            fh.close()


def _write_line(fh: Any, line: str, where: Path, fix: str) -> None:
    try:
        fh.write(line + "\n")
    except OSError as exc:
        raise OutputError(f"{where}: cannot write the token store ({exc.strerror or exc}); {fix}") from exc


# -- stage 2 and 3: plan and write ----------------------------------------------------------------


@dataclass
class Plan:
    """Which samples go in which row, and in what order rows are written."""

    store_rows: np.ndarray  # kept samples' store rows, grouped by row, ascending sample_index in a row
    lengths: np.ndarray  # their lengths in the row (truncated where needed)
    row_start: np.ndarray  # start of each row in store_rows (len rows + 1)
    order: packing.RowOrder
    drop_rows: dict[str, np.ndarray]  # store rows of the samples the plan leaves out, by reason
    truncated: int
    tokens: int
    trainable: int
    n_rows: int
    bound_l1: int
    bound_l2: int


def make_plan(config: PackConfig, store: TokenStore) -> Plan:
    """Apply the overflow policy and compute the bin plan from the sample lengths alone."""
    lengths = store.lengths.astype(np.int64)
    max_len = config.max_len
    drop_rows: dict[str, np.ndarray] = {}
    too_long = lengths > max_len
    keep = ~too_long
    eff = np.minimum(lengths, max_len)
    truncated = 0
    if config.overflow == "error" and too_long.any():
        k = int(np.flatnonzero(too_long)[0])
        source, unit = _source_of(store, int(store.sample_index[k]))
        raise InputError(
            f"{_where(source, unit, int(store.positions[k]))}: the sample has {lengths[k]} tokens, "
            f"more than --max-len {max_len}; raise --max-len or pass --overflow drop or truncate"
        )
    if config.overflow == "truncate":
        nothing = too_long & (store.first_trained >= max_len)
        keep = ~nothing
        truncated = int((too_long & ~nothing).sum())
        if nothing.any():
            drop_rows["nothing_to_train_after_truncation"] = np.flatnonzero(nothing)
    elif too_long.any():
        drop_rows["too_long"] = np.flatnonzero(too_long)
    kept = np.flatnonzero(keep)
    if len(kept) == 0:
        if len(lengths):
            raise InputError(
                f"no sample left to pack: all {len(lengths)} tokenized samples are longer than --max-len "
                f"{max_len} or have nothing to train on; raise --max-len"
            )
        reasons = ", ".join(f"{k}: {v}" for k, v in store.meta["dropped"].items())
        raise InputError(
            f"no sample left to pack: all {store.meta['records_read']} records were dropped ({reasons}); "
            "list them with --on-error skip --rejects FILE"
        )
    kept_len = eff[kept]
    bins = packing.plan_rows(kept_len, max_len, config.algorithm)
    by_row = np.argsort(bins, kind="stable")
    store_rows = kept[by_row]
    row_lengths = kept_len[by_row]
    counts = np.bincount(bins)
    row_start = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=row_start[1:])
    row_tokens = np.bincount(bins, weights=kept_len).astype(np.int64)
    order = packing.order_rows(row_tokens, config.seed, config.world_size, config.rank_remainder)
    if len(order.order) == 0:
        raise InputError(
            f"no sample left to pack: the {len(counts)} packed rows are fewer than --world-size "
            f"{config.world_size}, and --rank-remainder drop leaves none; lower --world-size or pass "
            "--rank-remainder pad"
        )
    dropped_samples = np.zeros(0, dtype=np.int64)
    if len(order.dropped_rows):
        dropped_samples = np.concatenate([store_rows[row_start[r] : row_start[r + 1]] for r in order.dropped_rows])
        drop_rows["world_size_remainder"] = dropped_samples
    trainable_per_sample = _trainable_in_rows(store, kept, eff)
    trainable = int(trainable_per_sample[kept].sum() - trainable_per_sample[dropped_samples].sum())
    return Plan(
        store_rows=store_rows,
        lengths=row_lengths,
        row_start=row_start,
        order=order,
        drop_rows=drop_rows,
        truncated=truncated,
        tokens=int(kept_len.sum()),
        trainable=trainable,
        n_rows=len(counts),
        bound_l1=packing.lower_bound_l1(kept_len, max_len),
        bound_l2=packing.lower_bound_l2(kept_len, max_len),
    )


def _trainable_in_rows(store: TokenStore, kept: np.ndarray, eff: np.ndarray) -> np.ndarray:
    """Return each sample's labelled tokens as written (reads only the labels cut off by truncation)."""
    trainable = store.trainable.astype(np.int64)
    cut = kept[eff[kept] < store.lengths[kept]]
    if len(cut):
        cut_off = store.lengths[cut] - eff[cut]
        with store.open_tokens() as reader:
            _, tails = reader.gather(store.starts[cut] + eff[cut], cut_off)
        owner = np.repeat(np.arange(len(cut)), cut_off)
        trainable[cut] -= np.bincount(owner, weights=tails != -100, minlength=len(cut)).astype(np.int64)
    return trainable


def _source_of(store: TokenStore, sample_index: int) -> tuple[str, str]:
    """Return (source path, position unit: line or record) of a sample."""
    sources = store.meta["sources"]
    k = int(np.searchsorted(np.asarray(store.meta["source_starts"]), sample_index, side="right")) - 1
    return sources[max(k, 0)]["path"], sources[max(k, 0)]["unit"]


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
    for start in range(0, len(rows), ROW_GROUP_ROWS):
        group = rows[start : start + ROW_GROUP_ROWS]
        samples_per_row = counts[group]
        first = np.cumsum(samples_per_row) - samples_per_row
        pick = np.repeat(plan.row_start[group], samples_per_row) + (
            np.arange(int(samples_per_row.sum()), dtype=np.int64) - np.repeat(first, samples_per_row)
        )
        store_rows = plan.store_rows[pick]
        ids, labels = reader.gather(starts[store_rows], plan.lengths[pick])
        yield build_rows(
            ids,
            labels,
            plan.lengths[pick],
            samples_per_row,
            store.sample_index[store_rows],
            pad_to=config.max_len if config.pad_to_max else None,
            pad_id=pad_id,
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
        return write_shard(tables, path, config.output_format)


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
            for entry in _map_ordered(_write_one_shard, ((s,) for s in range(n_shards)), workers):
                entries.append(entry)
                progress("write", entry["rows"], n_rows)
    except OSError as exc:
        raise OutputError(
            f"{config.output}: cannot write a shard ({exc.strerror or exc}); free disk space or choose another -o"
        ) from exc
    finally:
        _WRITE.clear()
    return entries


def load_engine(config: PackConfig) -> Any:
    """Return the module that tokenizes and writes: this one, or the Ray engine for --engine ray."""
    if config.engine == "local":
        return sys.modules[__name__]
    try:
        from packcli.engines import ray_engine
    except ImportError as exc:
        raise UsageError("--engine ray needs Ray, which is not installed; pip install 'packcli[ray]'") from exc
    return ray_engine


@dataclass
class TokenizedInputs:
    """The inputs, tokenized: the token store and what the manifest says about how it was made."""

    store: TokenStore
    cache: str  # hit | miss | off | rebuilt (the entry found was damaged)
    sources: list[InputSource]
    fingerprints: list[str]
    formats: dict[str, str | None]
    tokenizer: dict[str, Any]  # the tokenizer's identity
    pad_id: int
    warnings: list[str] = field(default_factory=list)


@contextlib.contextmanager
def tokenized_inputs(
    config: PackConfig, progress: Progress | None = None, scratch: Path | None = None, rule_out_long: bool = False
) -> Iterator[TokenizedInputs]:
    """Yield the inputs of ``config`` tokenized into a token store: from the cache, or made now.

    With the cache on, the store is the cache entry (found, or made and kept); with it off, it is made
    under ``scratch`` (a temporary directory when None) and removed afterwards. A cache hit loads no
    tokenizer: the key hashes the tokenizer's files and the template when they are local.

    ``rule_out_long`` (pack with --overflow drop or error, local engine) drops records that certainly
    exceed --max-len before tokenizing them (see packcli.bounds).
    """
    progress = progress or no_progress
    sources = resolve_inputs(list(config.inputs), config.split)
    formats: dict[str, str | None] = {}
    for source in sources:
        fmt, unparsed = (config.format, None) if config.format != "auto" else _sniff_format(source, config.fields)
        if fmt is None and unparsed is not None and config.on_error == "fail":
            raise InputError(f"{unparsed}; fix the record, or pass --on-error skip to skip bad records")
        if fmt is None and config.on_error == "fail":
            raise InputError(
                f"{source.display}: cannot tell the record format from the fields of its first records; "
                "pass --format, or --field to name the fields"
            )
        formats[source.display] = fmt
    cache_root = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    memo = cache_root / "input-hashes.json" if config.cache else None
    fingerprints = [fingerprint(s, memo) for s in sources]
    raise_if_stopped()
    encoder = None
    tokenizer_key = tokenizer_fingerprint(config.tokenizer, config.chat_template)
    if tokenizer_key is None:
        encoder = Encoder(config.tokenizer, config.chat_template, encode_options(config))
        tokenizer_key = encoder.identity()["sha256"] + encoder.identity()["chat_template_sha256"]
    key = cache_key(
        {
            "sources": [[s.display, s.kind, f] for s, f in zip(sources, fingerprints, strict=True)],
            "formats": formats,
            "fields": config.fields,
            "tokenizer": tokenizer_key,
            "train_on": config.train_on,
            "add_eos": config.add_eos,
            "template_kwargs": config.template_kwargs,
            "encoding_rules": ENCODING_RULES,
            "on_error": config.on_error,
            "version": __version__,
        }
    )
    rule_out_long = rule_out_long and config.engine == "local" and config.overflow in ("drop", "error")
    limit = config.max_len if rule_out_long else None
    store, state, warnings = _cached_store(cache_root / key, limit) if config.cache else (None, "off", [])
    with contextlib.ExitStack() as stack:
        if store is None:
            if encoder is None:
                encoder = Encoder(config.tokenizer, config.chat_template, encode_options(config))
            if config.cache:
                store_path = cache_root / key
            else:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=".packcli-tokens-", dir=scratch))
                store_path = Path(tmp) / "tokens"
            raise_if_stopped()
            engine = load_engine(config)
            if rule_out_long:
                store = engine.tokenize_to_store(
                    config, sources, formats, encoder, store_path, progress, rule_out_long=True
                )
            else:
                store = engine.tokenize_to_store(config, sources, formats, encoder, store_path, progress)
        yield TokenizedInputs(
            store=store,
            cache=state,
            sources=sources,
            fingerprints=fingerprints,
            formats=formats,
            tokenizer=store.meta["tokenizer"],
            pad_id=store.meta["pad_id"],
            warnings=warnings,
        )


def _cached_store(path: Path, rule_out_max_len: int | None) -> tuple[TokenStore | None, str, list[str]]:
    """Return the checked cache entry at ``path`` (or None), the cache state, and warnings.

    A damaged entry is never used: it is reported in one warning and made again (state "rebuilt").
    An entry that left out long records untokenized serves only runs that would drop them too: a run
    that truncates, or allows longer samples, makes the entry again (a miss).
    """
    try:
        store = find_store(path)
    except DamagedStore as exc:
        return None, "rebuilt", [f"the cache entry is damaged ({exc}); it is rebuilt"]
    # The byte limit is max_len * L, and L is the same (the tokenizer is in the key): comparing max
    # lengths compares limits.
    ruled_out = store.meta.get("ruled_out_max_len") if store is not None else None
    if ruled_out is not None and (rule_out_max_len is None or rule_out_max_len > ruled_out):
        return None, "miss", []
    return store, ("miss" if store is None else "hit"), []


def run_pack(config: PackConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run ``packcli pack`` and return its summary (also written into the manifest)."""
    progress = progress or no_progress
    started = time.perf_counter()
    engine = load_engine(config)
    # A filesystem URI (s3://, gs://, file://) has no rename: shards are written in place and the
    # manifest last, as the marker that the output is complete. Only the Ray engine writes there.
    to_uri = "://" in config.output
    if to_uri and config.engine != "ray":
        raise UsageError(f"-o {config.output}: a filesystem URI output needs --engine ray; or pass a local path")
    skipped: list[str] = []
    prepared = None
    if not config.dry_run:
        if to_uri:
            engine.check_uri_output(config.output, config.overwrite)
        else:
            prepared = _prepare_output(config, skipped)
    staged = prepared.staged if prepared else None
    try:
        scratch = staged.tmp if staged else None
        with tokenized_inputs(config, progress, scratch=scratch, rule_out_long=True) as inputs:
            t1 = time.perf_counter()
            store = inputs.store
            plan = make_plan(config, store)
            t2 = time.perf_counter()
            summary = _summary(config, store, plan, inputs.cache)
            summary["warnings"] = [*inputs.warnings, *summary["warnings"]]
            if not config.dry_run:
                shards = engine.write_output(
                    config, store, plan, staged.tmp if staged else None, progress, inputs.pad_id
                )
                if config.rejects:
                    rejects = prepared.rejects_path(config.rejects) if prepared else Path(config.rejects)
                    _write_rejects(rejects, store, plan)
                manifest = _manifest(config, inputs, summary, shards)
                if prepared and prepared.rejects_relative:
                    manifest["rejects_file"] = prepared.rejects_relative.as_posix()
        if staged is not None:
            write_manifest(staged.tmp, manifest, Path(config.output))
            staged.commit()
        elif to_uri and not config.dry_run:
            engine.write_manifest_uri(config.output, manifest)
        if not config.dry_run:
            summary["shards"] = len(shards)
        t3 = time.perf_counter()
    except BaseException:
        if staged is not None:
            staged.abort()
        raise
    finally:
        if prepared is not None:
            prepared.release()
    if skipped:
        summary["skipped_dirs"] = sorted(set(skipped))
    summary["seconds"] = {
        "tokenize": round(t1 - started, 3),
        "plan": round(t2 - t1, 3),
        "write": round(t3 - t2, 3),
        "total": round(t3 - started, 3),
    }
    summary["tokens_per_second"] = round(summary["tokens"] / max(t3 - started, 1e-9))
    return summary


def _prepare_output(config: PackConfig, skipped: list[str]) -> safety.PreparedOutput:
    """Lock and check the local output against the inputs, the cache and the rejects file."""
    sources = resolve_inputs(list(config.inputs), config.split, skipped)
    paths = [Path(s.path).resolve() for s in sources if s.kind != "hub"]
    cache_root = (Path(config.cache_dir) if config.cache_dir else default_cache_dir()) if config.cache else None
    return safety.prepare_output(config.output, config.overwrite, paths, cache_root, config.rejects)


def _summary(config: PackConfig, store: TokenStore, plan: Plan, cache_state: str) -> dict[str, Any]:
    dropped = Counter(store.meta["dropped"]) + Counter({k: len(v) for k, v in plan.drop_rows.items()})
    records = int(store.meta["records_read"])
    rows = len(plan.order.order)
    packed = records - sum(dropped.values())
    padded = int(sum(np.diff(plan.row_start)[plan.order.padded_rows])) if len(plan.order.padded_rows) else 0
    remainder = plan.drop_rows.get("world_size_remainder", np.zeros(0, np.int64))
    tokens = plan.tokens - int(store.lengths[remainder].sum())
    row_tokens_padded = sum(
        int(plan.lengths[plan.row_start[r] : plan.row_start[r + 1]].sum()) for r in plan.order.padded_rows
    )
    written_tokens = tokens + row_tokens_padded
    capacity = rows * config.max_len
    return {
        "records_read": records,
        "packed": packed,
        "dropped": dict(sorted(dropped.items())),
        "truncated": plan.truncated,
        "duplicated": padded,
        "tokens": written_tokens,
        "trainable_tokens": plan.trainable,
        "rows": rows,
        "max_len": config.max_len,
        "fill": round(written_tokens / capacity, 6) if capacity else 0.0,
        "lower_bound_l1": plan.bound_l1,
        "lower_bound_l2": plan.bound_l2,
        "rows_over_l2": plan.n_rows - plan.bound_l2,
        "rows_over_l2_fraction": round(plan.n_rows / plan.bound_l2 - 1, 6) if plan.bound_l2 else 0.0,
        "padding_tokens": capacity - written_tokens,
        "rows_without_packing": packed,
        "padding_tokens_without_packing": packed * config.max_len - tokens,
        "algorithm": config.algorithm,
        "world_size": config.world_size,
        "rank_tokens": [int(x) for x in plan.order.rank_tokens],
        "rank_token_spread": round(float(packing.rank_token_spread(plan.order.rank_tokens)), 6),
        "cache": cache_state,
        "output": None if config.dry_run else str(config.output),
        "warnings": list(store.meta["tokenizer"].get("warnings", [])),
    }


def _manifest(
    config: PackConfig, inputs: TokenizedInputs, summary: dict[str, Any], shards: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "packcli_version": __version__,
        "options": config.options(),
        "tokenizer": inputs.tokenizer,
        "inputs": [
            {"path": s.display, "kind": s.kind, "format": inputs.formats[s.display], "blake2b": f}
            for s, f in zip(inputs.sources, inputs.fingerprints, strict=True)
        ],
        "counts": {k: summary[k] for k in ("records_read", "packed", "dropped", "truncated", "duplicated")},
        **{
            k: summary[k]
            for k in (
                "tokens",
                "trainable_tokens",
                "rows",
                "max_len",
                "fill",
                "lower_bound_l1",
                "lower_bound_l2",
                "rows_over_l2",
                "rows_over_l2_fraction",
                "padding_tokens",
                "algorithm",
                "world_size",
                "rank_tokens",
                "rank_token_spread",
            )
        },
        "columns": ["input_ids", "labels", "position_ids", "seq_lengths", "sample_index"],
        "shards": shards,
    }


def _write_rejects(path: Path, store: TokenStore, plan: Plan) -> None:
    """Write every dropped record (with reason and input position) to a JSON lines file, atomically."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as out:
            with open(store.path / "rejects.jsonl", encoding="utf-8") as early:
                for line in early:
                    out.write(line)
            for reason, rows in plan.drop_rows.items():
                for r in rows.tolist():
                    source, _ = _source_of(store, int(store.sample_index[r]))
                    reject = {
                        "sample_index": int(store.sample_index[r]),
                        "source": source,
                        "position": int(store.positions[r]),
                        "reason": reason,
                        "detail": f"{int(store.lengths[r])} tokens",
                    }
                    out.write(json.dumps(reject) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the rejects file ({exc.strerror or exc})") from exc
