"""The pack run: read, normalise, tokenize (in worker processes), plan, write. Returns the summary."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from packcli import __version__, owned
from packcli.config import PackConfig
from packcli.contract import Progress, no_progress
from packcli.engines import load_engine
from packcli.errors import InputError, OutputError, RecordError, UsageError, raise_if_stopped
from packcli.io.readers import count_records, hub_reachable, read_batches
from packcli.io.sources import (
    STDIN,
    InputSource,
    changed_input,
    files_to_hash,
    fingerprint,
    forget_streams,
    is_uri,
    resolve_inputs,
    stamps,
)
from packcli.output import guard, staging
from packcli.output.formats import shard_format
from packcli.output.rows import (
    write_manifest,
)
from packcli.output.write import output_schema
from packcli.plan import dedup, mix
from packcli.plan import planner as plan_module
from packcli.plan.planner import Plan, make_plan
from packcli.records import preference
from packcli.records.formats import accepted_fields, detect_format
from packcli.run import accounting
from packcli.store.cachedir import EntryLock, parse_size, prune, touch
from packcli.store.tokens import (
    DamagedStore,
    TokenStore,
    cache_key,
    default_cache_dir,
    find_store,
)
from packcli.tokenize import ingest, worker
from packcli.tokenize.encoder import DEFAULT_TOKENIZER, Encoder, builtin_name, read_chat_template, tokenizer_fingerprint

# Bumped whenever the same inputs and options would give other tokens, labels or store meta, so the cache
# misses. 5: messages' own "train"/"weight" marks are read (and removed before rendering); 6: the tokens of
# pieces left out by --overflow split are in the store meta.
ENCODING_RULES = 6


# -- stage 1: tokenize into the token store ---------------------------------------------------------


def _sniff_format(
    source: InputSource, fields: dict[str, str], seen: list[str] | None = None
) -> tuple[str | None, str | None]:
    """Return the record format of a source, from the fields of its first readable records.

    When none of them could be parsed at all, also return why the first one could not (where and
    what), since that, not the format, is the problem to report. ``seen`` receives the fields of the
    records read (or what a record is, when it is no object), for the error that names them.
    """
    first_error = None
    parsed = False
    seen = [] if seen is None else seen
    for batch in read_batches([source], batch_size=50):
        errors = {pos: detail for pos, _, detail in batch.errors}
        for item, pos in zip(batch.items, batch.positions, strict=True):
            try:
                if pos in errors:
                    raise RecordError("", errors[pos])
                record = worker.parse_line(item) if batch.raw_lines else item
            except RecordError as err:
                unit = "line" if batch.raw_lines else "record"
                first_error = first_error or f"{worker.where(source.display, unit, pos)}: {err.detail}"
                continue
            parsed = True
            for name in record if isinstance(record, dict) else [f"a {type(record).__name__}, not an object"]:
                if str(name) not in seen:
                    seen.append(str(name))
            fmt = detect_format(record, fields)
            if fmt is not None:
                return fmt, None
        break
    return None, None if parsed else first_error


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
    task: str = "sft"  # sft, preference or kto (packcli.records.preference.resolve_task)
    key: str | None = None  # the cache entry's key (None with the cache off)


@contextlib.contextmanager
def tokenized_inputs(
    config: PackConfig,
    progress: Progress | None = None,
    scratch: Path | None = None,
    rule_out_long: bool = False,
    fill_cache: bool = True,
) -> Iterator[TokenizedInputs]:
    """Yield the inputs of ``config`` tokenized into a token store: from the cache, or made now.

    With the cache on, the store is the cache entry (found, or made and kept); with it off, it is made
    under ``scratch`` (a temporary directory when None) and removed afterwards. A cache hit loads no
    tokenizer: the key hashes the tokenizer's files and the template when they are local.

    ``rule_out_long`` (pack with --overflow drop or error, local engine) drops records that certainly
    exceed --max-len before tokenizing them (see packcli.tokenize.bounds).

    ``fill_cache`` False (a dry run) uses an entry found but writes nothing into the cache: a store
    made now is scratch, and the inputs' hashes are not remembered.

    The key is of contents, never of paths: the inputs' content hashes in order, with the reader and
    record format each was read with, and the tokenization options. An input that changes while it is
    read (its stamp or its hash differ from those taken before) stops the run, and nothing is stored.
    While the store is in use, the entry's lock is held (``packcli.store.cachedir``), so no prune removes it.
    """
    progress = progress or no_progress
    if config.chat_template is not None and builtin_name(config.chat_template) is None:
        read_chat_template(config.chat_template)  # an empty or unreadable template: before any input is read
    sources = resolve_inputs(list(config.inputs), config.split)
    before = stamps(sources)  # before the format is sniffed and the contents hashed
    formats: dict[str, str | None] = {}
    for source in sources:
        seen: list[str] = []
        fmt: str | None
        if config.format != "auto":
            fmt, unparsed = config.format, None
        else:
            fmt, unparsed = _sniff_format(source, config.fields, seen)
        if fmt is None and unparsed is not None and config.on_error == "fail":
            raise InputError(f"{unparsed}; fix the record, or pass --on-error skip to skip bad records")
        if fmt is None and config.on_error == "fail":
            shown = ", ".join(seen[:12]) + (f" and {len(seen) - 12} more" if len(seen) > 12 else "")
            raise InputError(
                f"{source.display}: cannot tell the record format from the fields of its first records "
                f"({shown or 'none'}); a record needs {accepted_fields(config.fields)}; "
                "pass --format, or --field to name the fields"
            )
        formats[source.display] = fmt
    task, formats = preference.resolve_task(
        config.task, formats, config.overflow, config.output_format, config.truncate_side
    )
    cache_root = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    memo = cache_root / owned.HASH_MEMO if config.cache else None
    remember = fill_cache
    # An engine may hash the input files elsewhere (the Ray engine: in tasks, not on the driver; nor
    # does it count records there).
    hashed = getattr(load_engine(config), "hash_files", None)
    encoder = None
    # Reading the inputs through (hashing them, counting records for the progress bar) and loading the
    # tokenizer each keep one core busy: where both are needed, they run side by side. The thread is
    # joined before any worker process is forked.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packcli-inputs") as ahead:
        if hashed is not None:
            known = hashed(config, files_to_hash(sources, memo))
            fingerprints = [fingerprint(s, memo, known, remember) for s in sources]
        elif config.cache:
            fingerprints = [fingerprint(s, memo, None, remember) for s in sources]  # the key needs them first
        else:
            hashing = ahead.submit(lambda: [fingerprint(s, None) for s in sources])
        tokenizer_key = tokenizer_fingerprint(config.tokenizer, config.chat_template)
        store_needed = not config.cache or tokenizer_key is None
        if store_needed:
            counting = ahead.submit(lambda: [count_records(s) for s in sources]) if hashed is None else None
            encoder = Encoder(config.tokenizer, config.chat_template, ingest.encode_options(config))
            if counting is not None:
                counting.result()
        if not config.cache and hashed is None:
            fingerprints = hashing.result()
    raise_if_stopped()
    if tokenizer_key is None:
        assert encoder is not None
        tokenizer_key = encoder.identity()["sha256"] + encoder.identity()["chat_template_sha256"]
    key = cache_key(
        {
            # Each input by its content, in order (sample_index follows it), with the reader its file type
            # chose and the record format found: never its path, so that any spelling of a path, a copy,
            # stdin or a preset run from elsewhere finds the same entry.
            "inputs": [
                [s.kind, s.compression, formats[s.display], f] for s, f in zip(sources, fingerprints, strict=True)
            ],
            "fields": config.fields,
            # --limit N reads the first N records only (absent without it: earlier keys stay valid).
            **({"limit": config.limit} if config.limit is not None else {}),
            "tokenizer": tokenizer_key,  # the files of the tokenizer and template, hashed
            # A template file, or none given (the tokenizer's own, else the default): never the same key.
            "template": "file" if config.chat_template is not None else "none given",
            # The rest of the tokenization options: they decide tokens and labels; no other option does.
            "tokenization": {
                k: v for k, v in config.group("tokenization").items() if k not in ("tokenizer", "chat_template")
            },
            # Split records are cut by the tokenizer's workers, so how they are cut is in the key too.
            "split": ingest.split_rule(config).__dict__ if config.overflow == "split" else None,
            "encoding_rules": ENCODING_RULES,
            "version": __version__,
        }
    )
    rule_out_long = rule_out_long and config.engine == "local" and config.overflow in ("drop", "error")
    limit = config.max_len if rule_out_long else None
    checker = getattr(load_engine(config), "digest_checker", None)  # who hashes a found entry's token files
    check = checker(config) if checker else None
    entry = cache_root / key
    with contextlib.ExitStack() as stack:
        if config.cache and (fill_cache or entry.exists()):
            lock = EntryLock(cache_root, key)
            if lock.acquire():  # held while the entry is in use: no prune removes it
                stack.callback(lock.release)
        store, state, warnings = _cached_store(entry, limit, check) if config.cache else (None, "off", [])
        if store is None and any(s.kind == "hub" for s in sources) and not hub_reachable():
            warnings.extend(
                f"{s.display}: the Hugging Face Hub cannot be reached; read from the local Hugging Face cache"
                for s in sources
                if s.kind == "hub"
            )
        if store is not None:
            if fill_cache:
                touch(entry)  # its last use, for pruning by age
            _as_this_run(store, sources, config)
        else:
            if encoder is None:
                encoder = Encoder(config.tokenizer, config.chat_template, ingest.encode_options(config))
            if config.cache and fill_cache:
                store_path = entry
            else:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=".packcli-tokens-", dir=scratch))
                store_path = Path(tmp) / "tokens"
            raise_if_stopped()
            engine = load_engine(config)

            rehashed = getattr(engine, "rehash_files", None)  # the Ray engine: hashed by tasks, as before

            def unchanged() -> None:
                known = rehashed(config, files_to_hash(sources)) if rehashed is not None else None
                moved = changed_input(sources, before, fingerprints, known)
                if moved is not None:
                    raise InputError(
                        f"{moved}: the input changed while it was read (its size, time stamps or contents differ "
                        "from before the run); nothing was cached or written; run again once it is no longer "
                        "being written"
                    )

            if rule_out_long:
                store = engine.tokenize_to_store(
                    config, sources, formats, encoder, store_path, progress, rule_out_long=True, before_finish=unchanged
                )
            else:
                store = engine.tokenize_to_store(
                    config, sources, formats, encoder, store_path, progress, before_finish=unchanged
                )
            if not (config.cache and fill_cache) and hasattr(engine, "discard_store"):
                stack.callback(engine.discard_store, store)  # a scratch store's tokens kept elsewhere
        yield TokenizedInputs(
            store=store,
            cache=state,
            sources=sources,
            fingerprints=fingerprints,
            formats=formats,
            tokenizer=store.meta["tokenizer"],
            pad_id=store.meta["pad_id"],
            warnings=warnings,
            task=task,
            key=key if config.cache else None,
        )


def _as_this_run(store: TokenStore, sources: list[InputSource], config: PackConfig) -> None:
    """A found entry, made by a run whose inputs, tokenizer or template may have had other paths: its
    metadata (in memory) names this run's, which the manifest, the rejects file and errors show."""
    original = [s["path"] for s in store.meta["sources"]]
    store.meta["sources"] = [{**m, "path": s.display} for m, s in zip(store.meta["sources"], sources, strict=True)]
    store.meta["original_paths"] = original
    tokenizer = dict(store.meta["tokenizer"])
    tokenizer["name"] = config.tokenizer or DEFAULT_TOKENIZER
    if config.chat_template is not None:  # the key holds the template's text, not its path
        builtin = builtin_name(config.chat_template)
        tokenizer["chat_template"] = builtin if builtin is not None else str(config.chat_template)
        tokenizer["chat_template_source"] = "packcli" if builtin is not None else "file"
    store.meta["tokenizer"] = tokenizer


def _cached_store(
    path: Path, rule_out_max_len: int | None, check_digests: Any = None
) -> tuple[TokenStore | None, str, list[str]]:
    """Return the checked cache entry at ``path`` (or None), the cache state, and warnings.

    A damaged entry is never used: it is reported in one warning and made again (state "rebuilt").
    An entry that left out long records untokenized serves only runs that would drop them too: a run
    that truncates, or allows longer samples, makes the entry again (a miss).
    """
    try:
        store = find_store(path, check_digests)
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
    forget_streams()  # stdin and FIFOs named by this run are read by this run
    cap = cache_cap(config)  # a bad $PACKCLI_CACHE_MAX_SIZE is refused before any work
    engine = load_engine(config)
    # A filesystem URI (s3://, gs://, file://) has no rename: shards are written in place and the
    # manifest last, as the marker that the output is complete. Only the Ray engine writes there.
    to_uri = "://" in config.output
    if to_uri and config.engine != "ray":
        raise UsageError(f"-o {config.output}: a filesystem URI output needs --engine ray; or pass a local path")
    if to_uri and shard_format(config.output_format).index_files:
        raise UsageError(
            f"-o {config.output}: --output-format {config.output_format} writes "
            f"{', '.join(shard_format(config.output_format).index_files)} beside the shards, which a URI output "
            "does not support yet; write to a local path, or use parquet or arrow"
        )
    skipped: list[str] = []
    prepared = None
    if not config.dry_run:
        if to_uri:
            engine.check_uri_output(config.output, config.overwrite)
            if config.rejects:
                guard.check_rejects_target(config.rejects, Path(config.rejects).resolve())
        else:
            prepared = _prepare_output(config, skipped)
    staged = prepared.staged if prepared else None
    try:
        scratch = staged.tmp if staged else None
        fill = not config.dry_run  # a dry run writes nothing, into the cache neither
        with tokenized_inputs(config, progress, scratch=scratch, rule_out_long=True, fill_cache=fill) as inputs:
            t1 = time.perf_counter()
            config = dataclasses.replace(config, task=inputs.task)  # the manifest records the task found
            seconds = dict(inputs.store.seconds)
            store = inputs.store
            # -- dedup (packcli.plan.dedup), then mixtures (packcli.plan.mix): the plan packs their view of the store
            deduped = dedup.drop_duplicates(store) if config.dedup == "exact" else None
            store = deduped.view if deduped is not None else store
            mixed = mix.choose(config, store, mix.mix_of_inputs(config)) if config.mix else None
            store = mixed.view if mixed is not None else store
            plan = make_plan(config, store)
            if mixed is not None:
                mix.part_repeats(config, mixed, plan)
            # -- end mixtures
            t2 = time.perf_counter()
            summary = accounting.summary(config, store, plan, inputs.cache)
            if deduped is not None:  # -- dedup
                summary["dedup"] = dedup.summary(deduped)
            if mixed is not None:  # -- mixtures: records left out by the mix are neither packed nor dropped
                summary["mix"] = mix.accounting(config, mixed, plan)
                summary["packed"] -= summary["mix"]["records_left_out"]
                if mixed.repeats_in_same_row:
                    summary["warnings"].append(mix.same_row_warning(mixed.repeats_in_same_row))
            accounting.check_loss(config, summary)
            summary["warnings"] = [*inputs.warnings, *summary["warnings"]]
            if not config.dry_run:
                shards = engine.write_output(
                    config, store, plan, staged.tmp if staged else None, progress, inputs.pad_id
                )
                index_files = _write_index_files(config, staged.tmp if staged else None, shards)
                if config.rejects:
                    rejects = prepared.rejects_path(config.rejects) if prepared else Path(config.rejects)
                    extra = deduped.rejects if deduped is not None else []  # -- dedup
                    _write_rejects(rejects, store, plan, inputs.sources, config.limit, extra)
                if config.fix_turns_log:
                    _write_fix_log(Path(config.fix_turns_log), store)
                manifest = _manifest(config, inputs, summary, shards)
                if "mix" in summary:  # -- mixtures: the sources the source column names, and their accounting
                    manifest["mix"] = summary["mix"]
                if "dedup" in summary:  # -- dedup
                    manifest["dedup"] = summary["dedup"]
                if index_files:
                    manifest["index_files"] = index_files
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
    if cap is not None and config.cache and not config.dry_run:
        cache_root = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
        keep = frozenset({inputs.key}) if inputs.key else frozenset()
        pruned = prune(cache_root, max_size=cap, keep=keep)
        summary["cache_pruned"] = {
            "entries": len(pruned["removed"]),
            "bytes": pruned["bytes_freed"],
            "bytes_left": pruned["bytes_after"],
            "max_size": cap,
        }
    summary["seconds"] = {
        "tokenize": round(t1 - started, 3),
        "plan": round(t2 - t1, 3),
        "write": round(t3 - t2, 3),
        "total": round(t3 - started, 3),
    }
    summary["stage_seconds"] = _stage_seconds(seconds, t1 - started, t2 - t1, t3 - t2)
    summary["tokens_per_second"] = round(summary["tokens"] / max(t3 - started, 1e-9))
    return summary


CACHE_MAX_SIZE_ENV = "PACKCLI_CACHE_MAX_SIZE"


def cache_cap(config: PackConfig) -> int | None:
    """The most bytes the cache may hold after a pack: --cache-max-size, else $PACKCLI_CACHE_MAX_SIZE."""
    if config.cache_max_size is not None:
        return parse_size(config.cache_max_size, "--cache-max-size")
    value = os.environ.get(CACHE_MAX_SIZE_ENV)
    return parse_size(value, f"${CACHE_MAX_SIZE_ENV}") if value else None


def _stage_seconds(made: dict[str, float], until_plan: float, plan: float, write: float) -> dict[str, float]:
    """Where a run's time went, by stage (see docs/reference/summary-and-manifest.md).

    ``made`` is what tokenize_to_store measured (empty on a cache hit): main-process seconds reading
    input and writing the store, and the workers' seconds decoding and tokenizing and their CPU
    seconds, summed over workers (so with N workers they may add up to N times the wall time).
    """
    stages = {
        "prepare": until_plan - made.get("wall", 0.0),  # inputs, hashes, tokenizer, cache lookup
        "read": made.get("read", 0.0),
        "decode": made.get("decode", 0.0),
        "tokenize": made.get("tokenize", 0.0),
        "store": made.get("store", 0.0),
        "plan": plan,
        "write": write,
        "workers_cpu": made.get("cpu", 0.0),
        "total": until_plan + plan + write,
    }
    return {k: round(max(v, 0.0), 3) for k, v in stages.items()}


def _prepare_output(config: PackConfig, skipped: list[str]) -> staging.PreparedOutput:
    """Lock and check the local output against the inputs, the cache and the rejects file."""
    sources = resolve_inputs(list(config.inputs), config.split, skipped)
    paths = [Path(s.path).resolve() for s in sources if s.kind != "hub" and not is_uri(s.path)]
    # A directory named as an input is an input as a whole, not only the files found in it: an -o inside
    # it is refused (its files come first, so an -o that contains them is named by the file it holds).
    paths += [Path(raw).resolve() for raw in config.inputs if raw != STDIN and not is_uri(raw) and Path(raw).is_dir()]
    cache_root = (Path(config.cache_dir) if config.cache_dir else default_cache_dir()) if config.cache else None
    if config.fix_turns_log:
        guard.check_fix_log_target(config.fix_turns_log, Path(config.output).resolve(), paths, cache_root)
    return staging.prepare_output(config.output, config.overwrite, paths, cache_root, config.rejects)


def _manifest(
    config: PackConfig, inputs: TokenizedInputs, summary: dict[str, Any], shards: list[dict[str, Any]]
) -> dict[str, Any]:
    task: dict[str, Any] = {"task": config.task}
    if config.task != "sft":
        task["sample_roles"] = {str(k): v for k, v in preference.ROLES.items()}
    return {
        "packcli_version": __version__,
        **task,
        "options": config.options(),
        "tokenizer": inputs.tokenizer,
        "inputs": [
            {"path": s.display, "kind": s.kind, "format": inputs.formats[s.display], "blake2b": f}
            for s, f in zip(inputs.sources, inputs.fingerprints, strict=True)
        ],
        "counts": {
            k: summary[k]
            for k in ("records_read", "packed", "samples", "dropped", "truncated", "duplicated", "split")
            if k in summary
        }
        | ({"limit": config.limit} if config.limit is not None else {}),
        "lost": summary["lost"],
        **({"turns_fixed": summary["turns_fixed"]} if "turns_fixed" in summary else {}),
        "empty_answers": summary["empty_answers"],
        "warnings": summary["warnings"],
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
                "alignment_padding_tokens",
                "algorithm",
                "world_size",
                "rank_tokens",
                "rank_token_spread",
            )
        },
        "columns": list(output_schema(config).names),  # as the shards read back (shard_formats)
        # A model's input embedding must have more rows than this (packcli.train.checks.check_compatible).
        "max_token_id": max((int(s.get("max_token_id", -1)) for s in shards), default=-1),
        "shards": shards,
    }


def _write_index_files(config: PackConfig, directory: Path | None, shards: list[dict[str, Any]]) -> list[str]:
    """Write the files the output format keeps beside its shards (MDS's index.json...); return their names."""
    fmt = shard_format(config.output_format)
    if directory is None or not fmt.index_files:
        return []
    try:
        return fmt.write_index(directory, shards, config.max_len)
    except OSError as exc:
        raise OutputError(
            f"{config.output}: cannot write {', '.join(fmt.index_files)} ({exc.strerror or exc}); "
            "free disk space or choose another -o"
        ) from exc


def _write_rejects(
    path: Path,
    store: TokenStore,
    plan: Plan,
    sources: list[InputSource],
    limit: int | None = None,
    extra: list[tuple[int, int, RecordError]] | None = None,
) -> None:
    """Write every dropped record (with reason and input position) to a JSON lines file, atomically.

    Records dropped before packing were written by the workers, with the record. Those the plan drops
    (too long, the world-size remainder, a piece of a split record) are in the token store as tokens
    only: their records are read again from the inputs, so that every entry has the same keys (see
    ``worker.reject``); a dropped piece is named by its ``piece_index`` beside its whole record.
    """
    planned = sorted(
        (int(store.sample_index[r]), reason, int(r)) for reason, rows in plan.drop_rows.items() for r in rows.tolist()
    )
    with _lines_file(path, "rejects", "the rejects file") as out:
        _copy_store_lines(store, store.path / "rejects.jsonl", out)
        extra = extra or []  # -- dedup: (sample_index, position, error) of records dropped before the plan
        raws = _records_at(sources, [p[0] for p in planned] + [e[0] for e in extra], limit)
        for index, reason, r in planned:
            source, _ = plan_module.source_of(store, index)
            err = RecordError(reason, f"{int(store.lengths[r])} tokens")
            raw, raw_lines = raws[index]
            position, piece = int(store.positions[r]), int(store.piece_index[r])
            entry = worker.reject(index, source, position, err, raw, raw_lines, piece_index=piece)
            out.write(json.dumps(entry, ensure_ascii=False) + "\n")
        for index, position, err in extra:  # -- dedup
            source, _ = plan_module.source_of(store, index)
            raw, raw_lines = raws[index]
            out.write(
                json.dumps(worker.reject(index, source, position, err, raw, raw_lines), ensure_ascii=False) + "\n"
            )


def _write_fix_log(path: Path, store: TokenStore) -> None:
    """Copy the token store's list of the records --fix-turns changed to ``path``, atomically."""
    with _lines_file(path, "fixes", "the --fix-turns-log file") as out:
        _copy_store_lines(store, store.path / ingest.TURN_FIXES, out)


@contextlib.contextmanager
def _lines_file(path: Path, suffix: str, what: str) -> Iterator[TextIO]:
    """Yield a text file that replaces ``path`` when the block ends; removed, and ``path`` untouched, on failure."""
    # A hidden name of this run's own, never a name a user file may have (FILE.tmp was).
    tmp = path.with_name(owned.staging_prefix(path.name) + suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as out:
            yield out
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write {what} ({exc.strerror or exc})") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _copy_store_lines(store: TokenStore, lines: Path, out: TextIO) -> None:
    """Copy a JSON lines file of the token store; from a found cache entry made from other paths, each
    line names the input as this run names it."""
    renamed = store.meta.get("original_paths", []) != [s["path"] for s in store.meta["sources"]]
    with open(lines, encoding="utf-8") as src:
        for line in src:
            out.write(_this_runs_source(line, store) if renamed else line)


def _this_runs_source(line: str, store: TokenStore) -> str:
    """A rejects or fix-log line of a found cache entry, naming the input as this run names it."""
    entry = json.loads(line)
    entry["source"], _ = plan_module.source_of(store, int(entry["sample_index"]))
    text = json.dumps(entry, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: kept escaped, as it was
        text = json.dumps(entry)
    return text + "\n"


def _records_at(sources: list[InputSource], wanted: list[int], limit: int | None) -> dict[int, tuple[Any, bool]]:
    """Read the inputs again up to the last wanted record; return (raw record, raw_lines) by sample_index."""
    found: dict[int, tuple[Any, bool]] = {}
    if not wanted:
        return found
    todo = set(wanted)
    last = max(wanted)
    for batch in read_batches(sources, batch_size=1000, limit=limit):
        end = batch.first_index + len(batch.items)
        for index in todo.intersection(range(batch.first_index, end)):
            found[index] = (batch.items[index - batch.first_index], batch.raw_lines)
        if end > last:
            break
    missing = todo - set(found)
    if missing:
        raise InputError(
            f"the inputs changed during the run: record {min(missing)} is no longer there to write to the rejects "
            "file; run again"
        )
    return found
