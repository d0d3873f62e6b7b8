"""The rejects file and the --fix-turns-log file of a run, each written atomically: the lines the token
store holds (named as this run names its inputs), and for the records the plan drops, their records read
again from the inputs."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from packcli.errors import InputError, Opt, OutputError, RecordError, Text, parts_of
from packcli.io.readers import read_batches
from packcli.io.sources import InputSource
from packcli.owned import staging_prefix
from packcli.plan.planner import Plan
from packcli.store.tokens import TokenStore
from packcli.tokenize.batches import ingest
from packcli.tokenize.batches.record_entries import reject


def write_rejects(
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
    ``record_entries.reject``); a dropped piece is named by its ``piece_index`` beside its whole record.
    """
    planned = sorted(
        (int(store.sample_index[r]), reason, int(r)) for reason, rows in plan.drop_rows.items() for r in rows.tolist()
    )
    with _lines_file(path, "rejects", "the rejects file") as out:
        _copy_store_lines(store, store.path / "rejects.jsonl", out)
        extra = extra or []  # (sample_index, position, error) of records dropped before the plan
        raws = _records_at(sources, [p[0] for p in planned] + [e[0] for e in extra], limit)
        for index, reason, r in planned:
            source, _ = store.source_of(index)
            err = RecordError(reason, f"{int(store.lengths[r])} tokens")
            raw, raw_lines = raws[index]
            position, piece = int(store.positions[r]), int(store.piece_index[r])
            entry = reject(index, source, position, err, raw, raw_lines, piece_index=piece)
            out.write(json.dumps(entry, ensure_ascii=False) + "\n")
        for index, position, err in extra:
            source, _ = store.source_of(index)
            raw, raw_lines = raws[index]
            out.write(json.dumps(reject(index, source, position, err, raw, raw_lines), ensure_ascii=False) + "\n")


def write_fix_log(path: Path, store: TokenStore) -> None:
    """Copy the token store's list of the records --fix-turns changed to ``path``, atomically."""
    with _lines_file(path, "fixes", ("the ", Opt("fix_turns_log"), " file")) as out:
        _copy_store_lines(store, store.path / ingest.TURN_FIXES, out)


@contextlib.contextmanager
def _lines_file(path: Path, suffix: str, what: Text) -> Iterator[TextIO]:
    """Yield a text file that replaces ``path`` when the block ends; removed, and ``path`` untouched, on failure."""
    # A hidden name of this run's own, never a name a user file may have (FILE.tmp was).
    tmp = path.with_name(staging_prefix(path.name) + suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as out:
            yield out
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write ", *parts_of(what), f" ({exc.strerror or exc})") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _copy_store_lines(store: TokenStore, lines: Path, out: TextIO) -> None:
    """Copy a JSON lines file of the token store; from a found cache entry made from other paths, each
    line names the input as this run names it."""
    renamed = (store.meta.original_paths or []) != [s.path for s in store.meta.sources]
    with open(lines, encoding="utf-8") as src:
        for line in src:
            out.write(_this_runs_source(line, store) if renamed else line)


def _this_runs_source(line: str, store: TokenStore) -> str:
    """A rejects or fix-log line of a found cache entry, naming the input as this run names it."""
    entry = json.loads(line)
    entry["source"], _ = store.source_of(int(entry["sample_index"]))
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
