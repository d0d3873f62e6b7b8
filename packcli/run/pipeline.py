"""The pack run: read, normalise, tokenize (in worker processes), plan, write. Returns the summary."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import cast

from packcli.config import PackConfig, Task, flag_term
from packcli.contract import SAMPLE_ROLES, Progress, no_progress
from packcli.engines import Engine, WriteJob, load_engine
from packcli.errors import OUTPUT, Opt, OutputError, UsageError
from packcli.io.sources import STDIN, InputSource, forget_streams, resolve_inputs
from packcli.io.uri import check_uri_output, is_uri, needs_ray, write_manifest_uri
from packcli.output import guard, reuse, staging
from packcli.output.formats import shard_format
from packcli.output.images import with_written_images
from packcli.output.layout import RowLayout
from packcli.output.manifest import write_manifest
from packcli.plan import holdout
from packcli.plan.planner import Plan
from packcli.results import CachePruned, Counts, Manifest, RunSummary, Seconds, ShardEntry, StageSeconds
from packcli.run.entries import cache_entry
from packcli.run.options import row_layout
from packcli.run.planned import EvalSplit, PlannedRun, plan_run, run_summary
from packcli.run.tokenized import TokenizedInputs, tokenized_inputs
from packcli.store.cachedir import parse_size, prune
from packcli.store.key import cache_root
from packcli.store.tokens import TokenStore
from packcli.version import __version__

__all__ = ["run_pack", "tokenized_inputs"]


def run_pack(config: PackConfig, progress: Progress | None = None, engine: Engine | None = None) -> RunSummary:
    """Run ``packcli pack`` and return its summary (also written into the manifest).

    ``engine`` is the engine the run uses, made from ``config.engine`` when None; it is closed when
    the run ends, however it ends.
    """
    progress = progress or no_progress
    started = time.perf_counter()
    forget_streams()  # stdin and FIFOs named by this run are read by this run
    cap = cache_cap(config)  # a bad $PACKCLI_CACHE_MAX_SIZE is refused before any work
    engine = engine or load_engine(config.engine, config.num_proc, config.ray_address)
    try:
        return _run(config, progress, engine, started, cap)
    finally:
        engine.close()


def _run(config: PackConfig, progress: Progress, engine: Engine, started: float, cap: int | None) -> RunSummary:
    """Check and lock the output, tokenize, plan, count and write; return the summary with its timings."""
    skipped: list[str] = []
    marks: dict[str, float] = {}  # when the summary and the shards were done (see _stage_seconds)
    prepared, sources = _checked_output(config, engine, skipped)
    staged = prepared.staged if prepared else None
    try:
        scratch = staged.tmp if staged else None
        fill = not config.dry_run  # a dry run writes nothing, into the cache neither
        with tokenized_inputs(
            config, progress, scratch=scratch, rule_out_long=True, fill_cache=fill, engine=engine, sources=sources
        ) as inputs:
            t1 = time.perf_counter()
            found = dataclasses.replace(
                config, task=cast(Task, inputs.task)
            )  # the summary and manifest record the task found
            seconds = dict(inputs.store.seconds)
            planned = plan_run(config, found, inputs)
            t2 = time.perf_counter()
            read_tokens = int(inputs.store.lengths.sum())  # every token tokenized: the loss's denominator
            summary, eval_split = run_summary(found, inputs, planned, read_tokens)
            marks["summary"] = time.perf_counter()
            if not config.dry_run:
                shards, manifest = _write_output(
                    config, found, inputs, engine, planned, summary, eval_split, prepared, progress, marks
                )
        if staged is not None:
            write_manifest(staged.tmp, manifest, Path(config.output))
            staged.commit()
        elif is_uri(config.output) and not config.dry_run:
            write_manifest_uri(config.output, manifest)  # the marker that the output is complete
        if not config.dry_run:
            summary = dataclasses.replace(summary, shards=len(shards))
        t3 = time.perf_counter()
    except BaseException:
        if staged is not None:
            staged.abort()
        raise
    finally:
        if prepared is not None:
            prepared.release()
    if skipped:
        summary = dataclasses.replace(summary, skipped_dirs=sorted(set(skipped)))
    summary = _with_pruned_cache(config, cap, inputs.key, summary)
    t4 = time.perf_counter()
    return dataclasses.replace(
        summary,
        seconds=Seconds(
            tokenize=round(t1 - started, 3),
            plan=round(t2 - t1, 3),
            write=round(t4 - t2, 3),
            total=round(t4 - started, 3),
        ),
        stage_seconds=_stage_seconds(seconds, inputs.hash_seconds, started, t1, t2, marks, t3, t4),
        tokens_per_second=round(read_tokens / max(t4 - started, 1e-9)),  # of what was tokenized (or read)
    )


def _checked_output(
    config: PackConfig, engine: Engine, skipped: list[str]
) -> tuple[staging.PreparedOutput | None, list[InputSource] | None]:
    """Check the output before any work; return the local output locked (and the inputs it was checked against).

    A dry run writes nothing: (None, None). A URI output (an engine with ``uri_output``): (None, None), the inputs
    resolved when tokenizing. ``skipped`` gets the directories left out of the inputs.
    """
    # A filesystem URI (s3://, gs://, file://) has no rename: shards are written in place and the
    # manifest last, as the marker that the output is complete. Only an engine with ``uri_output`` (the Ray
    # engine) writes there.
    to_uri = is_uri(config.output)
    if to_uri and not engine.uri_output:
        raise UsageError(*needs_ray(config.output))
    if to_uri and shard_format(config.output_format).index_files:
        raise UsageError(
            Opt("output", short=True),
            f" {config.output}: ",
            Opt("output_format", config.output_format),
            f" writes {', '.join(shard_format(config.output_format).index_files)} beside the shards, which a URI "
            "output does not support yet; write to a local path, or use parquet or arrow",
        )
    if config.dry_run:
        return None, None
    if to_uri:
        check_uri_output(config.output, config.overwrite)
        if config.rejects:
            guard.check_rejects_target(config.rejects, Path(config.rejects).resolve())
        return None, None
    sources = resolve_inputs(list(config.inputs), config.split, skipped)
    return _prepare_output(config, sources), sources


def _write_output(
    config: PackConfig,
    found: PackConfig,
    inputs: TokenizedInputs,
    engine: Engine,
    planned: PlannedRun,
    summary: RunSummary,
    eval_split: EvalSplit | None,
    prepared: staging.PreparedOutput | None,
    progress: Progress,
    marks: dict[str, float],
) -> tuple[list[ShardEntry], Manifest]:
    """Write the shards, their index files, the rejects, the fix log and the eval split; return shards and manifest.

    The manifest is written last, by the caller: it marks the output complete.
    """
    staged = prepared.staged if prepared else None
    store, plan = planned.store, planned.plan
    held_processor = store.meta.tokenizer.get("processor") or {}
    embedded = held_processor.get("images", {}).get("embedded", 0)
    spanned = _spanned(held_processor.get("family"))
    layout = row_layout(found, inputs.pad_id, embedded, spanned)
    shards = _reused_or_written(config, engine, layout, store, plan, staged.tmp if staged else None, progress)
    marks["shards"] = time.perf_counter()
    index_files = _write_index_files(config, staged.tmp if staged else None, shards)
    if config.rejects:
        from packcli.run.record_files import write_rejects

        rejects = prepared.rejects_path(config.rejects) if prepared else Path(config.rejects)
        extra = planned.deduped.rejects if planned.deduped is not None else []
        write_rejects(rejects, store, plan, inputs.sources, config.limit, extra)
    if config.fix_turns_log:
        from packcli.run.record_files import write_fix_log

        write_fix_log(Path(config.fix_turns_log), store)
    rejects_file = prepared.rejects_relative.as_posix() if prepared and prepared.rejects_relative else None
    manifest = _manifest(found, inputs, summary, shards, layout, index_files or None, rejects_file)
    if eval_split is not None and staged is not None:  # inside the staged output: all of it appears at once
        _write_eval(
            found, inputs, engine, layout, eval_split.held, eval_split.plan, eval_split.summary, staged.tmp, progress
        )
    return shards, manifest


def _spanned(family: str | None) -> bool:
    """Whether the processor family's image is a span of markers and image tokens (``vision.families.SPANNED``);
    a text run has no family, and imports no vision."""
    if family is None:
        return False
    from packcli.vision.families import SPANNED

    return family in SPANNED


def _reused_or_written(
    config: PackConfig,
    engine: Engine,
    layout: RowLayout,
    store: TokenStore,
    plan: Plan,
    directory: Path | None,
    progress: Progress,
) -> list[ShardEntry]:
    """Write the plan's shards into ``directory``, or take them from the store's cache entry where an earlier
    run wrote the same ones (``packcli.output.reuse``); a store that is a cache entry keeps what is written."""
    job = WriteJob(layout=layout, store=store, plan=plan, directory=directory, progress=progress)
    entry = cache_entry(config, store) if directory is not None else None
    key = reuse.shards_key(layout, plan) if entry is not None else None
    if directory is None or entry is None or key is None:
        return engine.write(job)
    found = reuse.reuse(entry, key, directory)
    if found is not None:
        progress("write", len(plan.order.order), len(plan.order.order))
        return found
    shards = engine.write(job)
    reuse.keep(entry, key, directory, shards)
    return shards


def _with_pruned_cache(config: PackConfig, cap: int | None, key: str | None, summary: RunSummary) -> RunSummary:
    """Prune the cache to ``cap`` bytes (never this run's entry, ``key``) if asked; return the summary saying so."""
    if cap is None or not config.cache or config.dry_run:
        return summary
    root = cache_root(config.cache_dir)
    keep = frozenset({key}) if key else frozenset()
    pruned = prune(root, max_size=cap, keep=keep)
    cache_pruned = CachePruned(
        entries=len(pruned["removed"]),
        bytes=pruned["bytes_freed"],
        bytes_left=pruned["bytes_after"],
        max_size=cap,
    )
    return dataclasses.replace(summary, cache_pruned=cache_pruned)


CACHE_MAX_SIZE_ENV = "PACKCLI_CACHE_MAX_SIZE"


def cache_cap(config: PackConfig) -> int | None:
    """The most bytes the cache may hold after a pack: --cache-max-size, else $PACKCLI_CACHE_MAX_SIZE."""
    if config.cache_max_size is not None:
        return parse_size(config.cache_max_size, "cache_max_size")
    value = os.environ.get(CACHE_MAX_SIZE_ENV)
    return parse_size(value, f"${CACHE_MAX_SIZE_ENV}") if value else None


def _stage_seconds(
    made: dict[str, float],
    hashing: float,
    started: float,
    tokenized: float,
    planned: float,
    marks: dict[str, float],
    written: float,
    ended: float,
) -> StageSeconds:
    """Where a run's time went, by stage (see docs/reference/summary-and-manifest.md).

    ``made`` is what tokenize_to_store measured (empty on a cache hit): main-process seconds reading
    input and writing the store, and the workers' seconds decoding and tokenizing and their CPU
    seconds, summed over workers (so with N workers they may add up to N times the wall time).
    ``hashing`` is the seconds spent reading the inputs through before tokenizing (hashes, record
    counts), in the main process or beside the tokenizer's loading. The clock readings: the run's
    start, the store ready, the plan made, ``marks`` (the summary's accounting done, the shards
    written: absent from a dry run), the output in place, and the end (after the cache's pruning).
    """
    counted = marks.get("summary", written)
    shards = marks.get("shards", counted)
    stages = {
        "prepare": tokenized - started - made.get("wall", 0.0),  # inputs, hashes, tokenizer, cache lookup
        "hash": hashing,
        "tokenize_wall": made.get("wall", 0.0),  # the main process, from the first batch to the store in place
        "read": made.get("read", 0.0),
        "decode": made.get("decode", 0.0),
        "tokenize": made.get("tokenize", 0.0),
        "store": made.get("store", 0.0),
        "plan": planned - tokenized,
        "summary": counted - planned,
        "write": shards - counted,
        "finish": written - shards,
        "prune": ended - written,
        "workers_cpu": made.get("cpu", 0.0),
        "total": ended - started,
    }
    return StageSeconds(**{k: round(max(v, 0.0), 3) for k, v in stages.items()})


def _prepare_output(config: PackConfig, sources: list[InputSource]) -> staging.PreparedOutput:
    """Lock and check the local output against the inputs, the cache and the rejects file."""
    paths = [Path(s.path).resolve() for s in sources if s.kind != "hub" and not is_uri(s.path)]
    # A directory named as an input is an input as a whole, not only the files found in it: an -o inside
    # it is refused (its files come first, so an -o that contains them is named by the file it holds).
    paths += [Path(raw).resolve() for raw in config.inputs if raw != STDIN and not is_uri(raw) and Path(raw).is_dir()]
    root = cache_root(config.cache_dir) if config.cache else None
    if config.fix_turns_log:
        guard.check_fix_log_target(config.fix_turns_log, Path(config.output).resolve(), paths, root)
    return staging.prepare_output(config.output, config.overwrite, paths, root, config.rejects)


def _manifest(
    config: PackConfig,
    inputs: TokenizedInputs,
    summary: RunSummary,
    shards: list[ShardEntry],
    layout: RowLayout,
    index_files: list[str] | None = None,
    rejects_file: str | None = None,
) -> Manifest:
    """The manifest of a run: how it was made (options, tokenizer, inputs), the summary's counts, its shards."""
    return Manifest(
        packcli_version=__version__,
        task=config.task,
        sample_roles={str(k): v for k, v in SAMPLE_ROLES.items()} if config.task != "sft" else None,
        options=config.options(),
        tokenizer=with_written_images(inputs.tokenizer, shards),
        inputs=[
            {"path": s.display, "kind": s.kind, "format": inputs.formats[s.display], "blake2b": f}
            for s, f in zip(inputs.sources, inputs.fingerprints, strict=True)
        ],
        counts=Counts(
            records_read=summary.records_read,
            packed=summary.packed,
            samples=summary.samples,
            dropped=summary.dropped,
            truncated=summary.truncated,
            duplicated=summary.duplicated,
            split=summary.split,
            limit=config.limit,
        ),
        lost=summary.lost,
        turns_fixed=summary.turns_fixed,
        empty_answers=summary.empty_answers,
        leading_answers=summary.leading_answers or None,
        tools_left_out=summary.tools_left_out or None,
        reasoning=summary.reasoning,
        expanded=summary.expanded,
        trees=summary.trees,
        prefix_trees=True if config.prefix_tree else None,
        warnings=[w.render(flag_term) for w in summary.warnings],  # the manifest records the command line's words
        tokens=summary.tokens,
        trainable_tokens=summary.trainable_tokens,
        rows=summary.rows,
        max_len=summary.max_len,
        fill=summary.fill,
        lower_bound_l1=summary.lower_bound_l1,
        lower_bound_l2=summary.lower_bound_l2,
        rows_over_l2=summary.rows_over_l2,
        rows_over_l2_fraction=summary.rows_over_l2_fraction,
        padding_tokens=summary.padding_tokens,
        alignment_padding_tokens=summary.alignment_padding_tokens,
        algorithm=summary.algorithm,
        world_size=summary.world_size,
        rank_tokens=summary.rank_tokens,
        rank_token_spread=summary.rank_token_spread,
        step_balance=summary.step_balance,
        columns=layout.columns(),  # as the shards read back (shard_formats)
        # A model's input embedding must have more rows than this (packcli.train.checks.check_compatible).
        max_token_id=max((s.max_token_id for s in shards if s.max_token_id is not None), default=-1),
        shards=shards,
        mix=summary.mix,
        dedup=summary.dedup,
        eval=summary.eval,
        index_files=index_files,
        rejects_file=rejects_file,
        encoder=summary.encoder,
    )


def _write_eval(
    config: PackConfig,
    inputs: TokenizedInputs,
    engine: Engine,
    layout: RowLayout,
    held: holdout.Holdout,
    plan: Plan,
    summary: RunSummary,
    staged: Path,
    progress: Progress,
) -> None:
    """Write the eval records' shards and manifest into ``eval/`` of the staged output (a mix's source column too)."""
    directory = staged / holdout.PATH
    directory.mkdir()
    shards = engine.write(WriteJob(layout=layout, store=held.eval, plan=plan, directory=directory, progress=progress))
    index_files = _write_index_files(config, directory, shards)
    manifest = _manifest(config, inputs, summary, shards, layout, index_files or None)
    write_manifest(directory, manifest, Path(config.output) / holdout.PATH)


def _write_index_files(config: PackConfig, directory: Path | None, shards: list[ShardEntry]) -> list[str]:
    """Write the files the output format keeps beside its shards (MDS's index.json...); return their names."""
    fmt = shard_format(config.output_format)
    if directory is None or not fmt.index_files:
        return []
    try:
        return fmt.write_index(directory, [s.file for s in shards], config.max_len)
    except OSError as exc:
        raise OutputError(
            f"{config.output}: cannot write {', '.join(fmt.index_files)} ({exc.strerror or exc}); "
            "free disk space or choose another ",
            OUTPUT,
        ) from exc
