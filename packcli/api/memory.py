"""In-memory inputs (a ``datasets.Dataset``, a list of records) written to a temporary folder for one call."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packcli.errors import Message, PackcliError, Part, UsageError
from packcli.jsontypes import Record


@contextmanager
def as_paths(inputs: Any, cache_dir: str | os.PathLike[str] | None) -> Iterator[tuple[list[str], dict[str, str]]]:
    """Yield ``inputs`` as paths: in-memory records and datasets are written to a temporary folder for
    the call (removed after it); the cache is keyed by contents, so the same records hit it again.

    Also yield, for such a file, what messages call it instead: the user's list or dataset, not a file
    of packcli's that the user never made.
    """
    if isinstance(inputs, (str, os.PathLike)):
        yield [os.fspath(inputs)], {}
        return
    if is_dataset(inputs):
        with memory_dir(cache_dir) as root:
            path = root / "dataset"
            inputs.save_to_disk(str(path))
            yield [str(path)], {str(path): "the in-memory dataset"}
        return
    items = list(inputs)
    if items and all(isinstance(x, (str, os.PathLike)) for x in items):
        yield [os.fspath(x) for x in items], {}
        return
    if not all(isinstance(x, Mapping) for x in items):
        raise UsageError("inputs must be a path, a list of paths, a datasets.Dataset or a list of records (dicts)")
    with memory_dir(cache_dir) as root:
        path = root / "records.jsonl"
        with open(path, "wb") as fh:
            for x in items:
                fh.write((record_line(dict(x)) + "\n").encode())
        yield [str(path)], {str(path): "the in-memory records"}


def record_line(record: Record) -> str:
    """One in-memory record as a JSON line; one that JSON cannot hold (bytes, arrays) as the line the
    worker rejects with that reason (``records.UNUSABLE``)."""
    from packcli.records.checks import UNUSABLE, unusable_value

    err = unusable_value(record)
    if err is None:
        return json.dumps(record, ensure_ascii=False, default=str)
    shown = json.dumps(record, ensure_ascii=False, default=repr)
    return json.dumps({UNUSABLE: {"reason": err.reason, "detail": err.detail, "record": shown}}, ensure_ascii=False)


def memory_root(config: Any) -> Path | None:
    """Return where in-memory inputs are written for a call: beside the cache when it is on and filled
    (the disk the user chose for packcli's data), else the system's temporary directory."""
    if not config.cache or config.dry_run:
        return None
    from packcli.store.key import default_cache_dir

    return Path(config.cache_dir) if config.cache_dir is not None else default_cache_dir()


@contextmanager
def memory_dir(cache_dir: str | os.PathLike[str] | None) -> Iterator[Path]:
    """A temporary folder for one call's in-memory inputs; its name lets a later run remove it should
    this process be killed (``safety.clean_stale_cache_dirs``)."""
    from packcli.owned import owner_tag

    where = None
    if cache_dir is not None:
        where = Path(cache_dir)
        where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".tmp-{owner_tag()}-inputs-", dir=where) as tmp:
        yield Path(tmp)


def is_dataset(value: Any) -> bool:
    return type(value).__name__ == "Dataset" and hasattr(value, "save_to_disk")


def in_memory_terms(message: str, names: Mapping[str, str] | None) -> str:
    """Name the files in-memory inputs were written to as what the caller passed (``names``: path ->
    words), their lines as the list's indices (from 0)."""
    for path, words in (names or {}).items():
        at_line = re.compile(re.escape(path) + r" line (\d+)")

        def at_index(m: re.Match[str], w: str = words) -> str:
            return f"{w}, index {int(m.group(1)) - 1}"

        message = at_line.sub(at_index, message).replace(path, words)
    return message


def _renamed(parts: tuple[Part, ...], names: Mapping[str, str]) -> tuple[Part, ...]:
    return tuple(in_memory_terms(p, names) if isinstance(p, str) else p for p in parts)


def named_as_passed(warning: Message, names: Mapping[str, str] | None) -> Message:
    """Return a warning with in-memory inputs named as the caller passed them (``in_memory_terms``)."""
    return Message(*_renamed(warning.parts, names)) if names else warning


@contextmanager
def errors_named_as_passed(names: Mapping[str, str] | None) -> Iterator[None]:
    """Re-raise packcli errors with in-memory inputs named as the caller passed them (``in_memory_terms``)."""
    try:
        yield
    except PackcliError as exc:
        if not names:
            raise
        message, hint = _renamed(exc.message, names), _renamed(exc.hint, names)
        if (message, hint) == (exc.message, exc.hint):
            raise
        raise type(exc)(*message, option=exc.option, hint=hint) from exc
