"""Stage 1: every record of the inputs tokenized (by the workers) and accounted for, into a token store."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from packcli import __version__, errors
from packcli.config import PackConfig
from packcli.contract import Progress
from packcli.errors import InputError, OutputError
from packcli.io.readers import count_records, read_batches
from packcli.io.sources import InputSource
from packcli.procs import pool
from packcli.records import turns
from packcli.store.images import IMAGES_FILE, image_line
from packcli.store.tokens import (
    TokenStore,
    TokenStoreWriter,
)
from packcli.tokenize import rounds, trees, worker
from packcli.tokenize.bounds import max_token_bytes
from packcli.tokenize.encode_service import EncodeService, encode_in_main
from packcli.tokenize.encoder import EncodeOptions, Encoder
from packcli.tokenize.split import SplitRule
from packcli.tokenize.worker import TokenizedBatch

# Reasons a record is left out by policy: always counted, never an error. Every other reason is bad
# data, which stops the run unless --on-error skip.
POLICY_DROPS = frozenset(
    {
        "empty",
        "empty_conversation",
        "no_assistant_turn",
        "nothing_to_train",
        "no_answer_after_fix",
        "too_long",
        "nothing_to_train_after_truncation",
        "no_piece_left",
        "image_cut",
        "world_size_remainder",
    }
)
BATCH_SIZE = 256
# In the token store: one JSON line per record --fix-turns changed (copied out by --fix-turns-log).
TURN_FIXES = "turn_fixes.jsonl"


class RemoteTokenizing(Protocol):
    """An engine's tokenizing that reads the inputs and writes the tokens where it runs (the Ray engine's)."""

    segment_root: str | None  # where the token segments are written; None: into the store's directory

    def results(self, directory: Path) -> Iterator[TokenizedBatch]:
        """Yield, in input order, batches whose tokens are a store segment (``segment``), not arrays."""
        ...


def encode_options(config: PackConfig) -> EncodeOptions:
    """Return the options that decide a sample's tokens and labels."""
    return EncodeOptions(config.train_on, config.add_eos, EncodeOptions.kwargs_items(config.template_kwargs))


def split_rule(config: PackConfig) -> SplitRule | None:
    """Return how long records are cut into pieces (``--overflow split``), or None."""
    if config.overflow != "split":
        return None
    # Pieces are cut to the most a sample may hold once padded (--pad-to-multiple-of): --max-len without it.
    return SplitRule(config.sample_limit, config.split_system, config.min_piece)


def image_window(config: PackConfig) -> tuple[int, str] | None:
    """Return (the most tokens a sample keeps, the side it is cut from) when samples may be cut, with a processor.

    Under --overflow truncate (and split, whose pieces too long on their own are cut), a sample whose
    cut would cut an image's tokens is left out instead (reason ``image_cut``).
    """
    if config.processor is None or config.overflow not in ("truncate", "split"):
        return None
    return config.sample_limit, config.cut_side


def processor_identity(encoder: Encoder) -> dict[str, Any]:
    """Return what the manifest records of the run's processor."""
    vision = encoder.vision
    return {
        "dir": os.path.abspath(vision.name),  # verify and the collator may run from any directory
        "family": vision.family,
        "image_token": vision.image_token,
        "image_token_id": encoder.image_token_id,
        "sha256": vision.identity(),
    }


def long_text_bytes(config: PackConfig, encoder: Encoder) -> int | None:
    """Return the UTF-8 bytes over which a text is encoded by windows (``Encoder.long_text_bytes``), or None.

    Under --overflow truncate or split, a text over the early too-long rule's bound (packcli.tokenize.bounds)
    certainly has more tokens than a row: it is encoded by windows, in bounded memory.
    """
    if config.overflow not in ("truncate", "split"):
        return None
    token_bytes = max_token_bytes(encoder.backend_json)
    return config.max_len * token_bytes if token_bytes else None


def tokenize_to_store(
    config: PackConfig,
    sources: list[InputSource],
    formats: dict[str, str | None],
    encoder: Encoder,
    store_path: Path,
    progress: Progress,
    map_ordered: Callable[..., Iterator[Any]] | None = None,
    rule_out_long: bool = False,
    remote: RemoteTokenizing | None = None,
    before_finish: Callable[[], None] | None = None,
) -> TokenStore:
    """Tokenize every record of the sources into a token store at ``store_path``.

    ``map_ordered(fn, jobs, num_proc)`` runs the batches and yields their results in order: worker
    processes here by default; another engine passes its own (the Ray engine runs them on a cluster).
    With ``rule_out_long``, records that certainly have more than --max-len tokens are dropped as
    too_long before tokenizing (see packcli.tokenize.bounds); the store then lacks them, which its meta records.

    ``remote`` is an engine that reads and tokenizes the inputs itself and writes the tokens where it
    makes them: ``remote.results(directory)`` yields, in input order, TokenizedBatch results whose
    tokens are a segment (``segment``, ``segment_files``) instead of arrays; it may write the
    segments into ``directory`` (the store being made) or under ``remote.segment_root``. This process
    then reads no input and no token, and keeps the same accounting.

    ``before_finish`` runs once every record is read, before the store is moved into place; what it
    raises leaves no store (the run checks there that no input changed while it was read).
    """
    map_ordered = map_ordered or pool.map_ordered
    token_bytes = max_token_bytes(encoder.backend_json) if rule_out_long else None
    rule_out = (config.max_len, token_bytes) if token_bytes else None
    worker.use(
        encoder,
        config.fields,
        rule_out,
        split_rule(config),
        fix_turns=config.fix_turns,
        image_window=image_window(config),
        expand_turns=config.expand_turns,
        prefix_tree=config.max_len if config.prefix_tree else None,
    )
    encoder.long_text_bytes = long_text_bytes(config, encoder)
    ruled_out_bytes = config.max_len * token_bytes if token_bytes else None
    where, fix = _store_where_fix(config, store_path)
    writer = TokenStoreWriter(store_path, fix, where)
    assert writer.tmp is not None  # set by the writer, or it raised
    counts: Counter[str] = Counter()
    left_out: Counter[str] = Counter()
    turns_fixed: Counter[str] = Counter()
    empty_answers = 0
    leading_answers = 0
    tools_left_out = 0
    slow_records = 0  # records whose masks the fast encoder left to the reference, in the workers
    slow_here = encoder.text.slow_records  # ... and in this process (the encode service)
    reasoning: Counter[str] = Counter()
    expanded: Counter[str] = Counter()
    prefix_trees: Counter[str] = Counter()
    left_out_tokens: Counter[str] = Counter()
    clock: defaultdict[str, float] = defaultdict(float)  # seconds by stage (see TokenStore.seconds)
    began = time.perf_counter()
    records = 0
    records_split = pieces = 0
    rejects_path = writer.tmp / "rejects.jsonl"
    n_stored = 0  # samples stored so far: the image table's sample numbers
    image_counts: Counter[str] = Counter()  # the store's (embedded: whether rows need image_bytes), not the manifest's
    images_file: Any = None
    fixes_path = writer.tmp / TURN_FIXES
    starts: dict[str, int] = {}
    units: dict[str, str] = {}
    counted = [count_records(s) for s in sources] if remote is None else [None]
    total = None if None in counted else sum(counted)  # type: ignore[arg-type]
    if config.limit is not None:
        total = min(total, config.limit) if total is not None else None
    results: Iterator[TokenizedBatch] | None = None
    service: EncodeService | None = None
    if remote is None and config.num_proc > 1 and encoder.vision is None and encode_in_main():
        service = EncodeService(encoder)
        encoder.remote = service.client()
    try:
        with (
            contextlib.ExitStack() as stack,
            _open_for_writing(rejects_path, where, fix) as rejects_file,
            _open_for_writing(fixes_path, where, fix) as fixes_file,
        ):
            if remote is None:
                batches = _timed(read_batches(sources, BATCH_SIZE, config.limit), clock, "read")
                jobs = ((batch, formats[batch.source]) for batch in batches)
                if service is not None:
                    results = pool.map_ordered(worker.tokenize_batch, jobs, config.num_proc, service.start)
                else:
                    results = map_ordered(worker.tokenize_batch, jobs, config.num_proc)
            else:
                results = remote.results(writer.tmp)
            for result in results:
                stored = time.perf_counter()
                for key, value in result.seconds.items():
                    clock[key] += value
                records += result.n_records
                records_split += result.records_split
                left_out.update(result.pieces_left_out)
                left_out_tokens.update(result.tokens_left_out)
                pieces += result.pieces_made
                turns_fixed.update(result.turns_fixed)
                empty_answers += result.empty_answers
                leading_answers += result.leading_answers
                tools_left_out += result.tools_left_out
                slow_records += result.slow_records
                reasoning.update(result.reasoning)
                expanded.update(result.expanded)
                prefix_trees.update(result.prefix_trees)
                for entry in result.turn_fixes:
                    _write_line(fixes_file, json.dumps(entry, ensure_ascii=False), where, fix)
                starts.setdefault(result.source, result.first_index)
                units.setdefault(result.source, result.unit)
                for reject in result.rejects:
                    if reject["reason"] == "too_long" and config.overflow == "error":
                        where_record = errors.where(reject["source"], reject["unit"], reject["position"])
                        raise InputError(
                            f"{where_record}: {reject['detail']}; "
                            "raise --max-len or pass --overflow split, truncate or drop"
                        )
                    if reject["reason"] not in POLICY_DROPS and config.on_error == "fail":
                        where_record = errors.where(reject["source"], reject["unit"], reject["position"])
                        raise InputError(f"{where_record}: {reject['detail']}; {errors.record_fix(reject['reason'])}")
                    counts[reject["reason"]] += 1
                    _write_line(rejects_file, json.dumps(reject, ensure_ascii=False), where, fix)
                if result.images is not None:
                    for j, images in enumerate(result.images):
                        if not images:
                            continue
                        if images_file is None:
                            images_file = stack.enter_context(_open_for_writing(writer.tmp / IMAGES_FILE, where, fix))
                        _write_line(images_file, image_line(n_stored + j, images), where, fix)
                        image_counts["samples"] += 1
                        image_counts["images"] += len(images)
                        image_counts["image_tokens"] += sum(im["tokens"] for im in images)
                        image_counts["embedded"] += sum(im.get("bytes") is not None for im in images)
                n_stored += len(result.lengths)
                if result.segment is not None:
                    writer.add_segment(
                        result.segment,
                        result.segment_files,
                        result.sample_index,
                        result.lengths,
                        result.trainable,
                        result.first_trained,
                        result.positions,
                        result.piece_index,
                        result.roles,
                        content_keys=result.content_keys,
                        tree_nodes=result.tree_nodes,
                    )
                else:
                    writer.add(
                        result.sample_index,
                        result.lengths,
                        result.ids,
                        result.labels,
                        result.trainable,
                        result.first_trained,
                        result.positions,
                        result.piece_index,
                        result.roles,
                        content_keys=result.content_keys,
                        tree_nodes=result.tree_nodes,
                    )
                clock["store"] += time.perf_counter() - stored
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
        if config.fix_turns:
            meta["turns_fixed"] = {kind: turns_fixed[kind] for kind in turns.KINDS}
        if empty_answers:
            meta["empty_answers"] = empty_answers
        if leading_answers:
            meta["leading_answers"] = leading_answers
        if tools_left_out:
            meta["tools_left_out"] = tools_left_out
        if service is not None:
            slow_records += encoder.text.slow_records - slow_here
        # Which encoder made the tokens (the cache key does not depend on it: every one gives the same).
        meta["encoder"] = encoder.choice.record() | {"records_slow": slow_records}
        if reasoning:
            meta["reasoning"] = {key: reasoning[key] for key in rounds.REASONING_KEYS}
        if config.expand_turns != "off":
            meta["expanded"] = {key: expanded[key] for key in rounds.EXPANDED_KEYS}
        if config.prefix_tree:
            meta["trees"] = {key: prefix_trees[key] for key in trees.TREE_KEYS}
        if encoder.vision is not None:
            meta["tokenizer"] = {
                **encoder.identity(),
                "processor": processor_identity(encoder)
                | {"images": {k: image_counts[k] for k in ("samples", "images", "image_tokens", "embedded")}},
            }
        if config.overflow == "split":
            meta["split"] = {
                "records_split": records_split,
                "pieces": pieces,
                "pieces_left_out": dict(sorted(left_out.items())),
                # The tokens of the pieces left out, by reason: counted in the summary's lost tokens.
                "tokens_left_out": dict(sorted(left_out_tokens.items())),
            }
        if ruled_out_bytes is not None and counts["too_long"]:
            # Records over this many bytes were left out untokenized: only runs whose limit is no
            # higher may use this store (see _cached_store).
            meta["ruled_out_over_bytes"] = ruled_out_bytes
            meta["ruled_out_max_len"] = config.max_len
        meta["made"] = {"packcli_version": __version__, "time": round(time.time(), 3)}
        if before_finish is not None:
            before_finish()
        finishing = time.perf_counter()
        if remote is None:
            store = writer.finish(meta)
        else:
            store = writer.finish(meta, segment_root=remote.segment_root, verify=False)
        clock["store"] += time.perf_counter() - finishing
        clock["wall"] = time.perf_counter() - began
        store.seconds = dict(clock)
        return store
    except BaseException:
        # Stop the workers here, in this thread: left to the garbage collector, a suspended results
        # generator would stop them from wherever the collection happens to run.
        close = getattr(results, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):  # the error being raised is the one to report
                close()
        writer.abort()
        raise
    finally:
        worker.release()
        encoder.long_text_bytes = None
        encoder.remote = None
        if service is not None:
            service.close()


def _timed(items: Iterator[Any], clock: defaultdict[str, float], key: str) -> Iterator[Any]:
    """Yield from ``items``, adding the seconds spent getting each one to ``clock[key]``."""
    while True:
        t = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            clock[key] += time.perf_counter() - t
            return
        clock[key] += time.perf_counter() - t
        yield item


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
