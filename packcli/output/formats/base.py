"""What every shard format shares: the ``ShardFormat`` base class, its writer protocol, the checks of
index files against the shards they describe, and the error a damaged shard raises."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from packcli.jsontypes import JSONObject

if TYPE_CHECKING:
    import pyarrow as pa

READ_BATCH_ROWS = 1024
# Why an index file must be there (verify: "index.json: is missing: <this>, but the file is not there").
MISSING_INDEX = "a trainer's reader of this output format opens it"
MAX_INDEX_PROBLEMS = 5  # per index file: the first few differences name the damage well enough


class ShardWriter(Protocol):
    """Writes the row groups of one shard, one table at a time."""

    def write(self, table: pa.Table) -> None: ...

    def close(self) -> None: ...


class ShardFormat:
    """A shard file format: its name, file extension, writer and readers."""

    name: ClassVar[str]
    extension: ClassVar[str]
    # Files the format keeps beside its shards (written once every shard is), e.g. MDS's index.json.
    index_files: ClassVar[tuple[str, ...]] = ()
    # How ``datasets`` opens a shard as it is (memory-mapped): "parquet" (``Dataset.from_parquet``) or
    # "arrow" (``Dataset.from_file``); None: training reads it back as packcli rows, in memory.
    datasets_reader: ClassVar[str | None] = None

    def write_index(self, directory: Path, files: Sequence[str], max_len: int) -> list[str]:
        """Write the format's index files for the shard files ``files`` in ``directory``; return their names."""
        return []

    def index_problems(self, directory: Path, files: Sequence[str], max_len: int) -> list[tuple[str, str]]:
        """Return what is wrong in the index files beside the shard files ``files``, as (file, message) pairs.

        Each index file is compared with the one ``write_index`` would write for these shards, read
        again: a trainer's reader takes its columns, counts and sizes from it, not from the shards.
        A missing index file is one problem; the shards are read only when every index file is there.
        """
        problems = [
            (name, f"is missing: {MISSING_INDEX} but the file is not there")
            for name in self.index_files
            if not (directory / name).is_file()
        ]
        if problems or not self.index_files:
            return problems
        return self._index_problems(directory, files, max_len)

    def _index_problems(self, directory: Path, files: Sequence[str], max_len: int) -> list[tuple[str, str]]:
        return []

    def writer(self, path: Path, schema: pa.Schema) -> ShardWriter:
        """Return a writer for a new shard at ``path``."""
        raise NotImplementedError

    def batches(self, path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Yield the shard's rows as record batches of at most ``batch_rows``, one decoded at a time."""
        raise NotImplementedError

    def schema(self, path: Path) -> pa.Schema:
        """Return the shard's schema without reading its rows."""
        raise NotImplementedError

    def read(self, path: Path) -> pa.Table:
        """Return the whole shard as a table."""
        import pyarrow as pa

        return pa.Table.from_batches(list(self.batches(path, None, READ_BATCH_ROWS)), schema=self.schema(path))


# -- index files: compared with the ones the shards give (ShardFormat._index_problems) --------------


def read_index(directory: Path, name: str) -> tuple[Any, list[tuple[str, str]]]:
    """Return an index file's JSON, or the problem that it cannot be read."""
    try:
        return json.loads((directory / name).read_text(encoding="utf-8")), []
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not JSON, or not UTF-8
        return None, [(name, f"cannot be read ({type(exc).__name__}: {exc})".splitlines()[0])]


def index_value(value: Any) -> str:
    """Return ``value`` as an index problem's message shows it: sorted JSON."""
    return json.dumps(value, sort_keys=True)


def compare_index(name: str, what: str, found: Any, expected: JSONObject, source: str) -> list[tuple[str, str]]:
    """Compare an index object with the one ``source`` gives: one problem per key that differs.

    Objects are compared key by key and lists of the same length item by item, so that a message
    names what differs (``column_names[0]``, ``raw_data.bytes``) rather than the whole value.
    """
    if not isinstance(found, dict):
        return [(name, f"{what} is not a JSON object")]
    problems = []
    for path, got, want in _differences("", found, expected):
        if got is _ABSENT:
            problems.append((name, f"{what} lacks {path} ({source} {index_value(want)})"))
        else:
            problems.append((name, f"{what} has {path} {index_value(got)} where {source} {index_value(want)}"))
    return problems


_ABSENT = object()


def _differences(path: str, found: Any, expected: Any) -> Iterator[tuple[str, Any, Any]]:
    """Yield (path, found, expected) for each place where ``found`` is not ``expected`` (bools apart from ints)."""
    if isinstance(expected, dict) and isinstance(found, dict):
        for key, want in expected.items():
            where = f"{path}.{key}" if path else key
            if key not in found:
                yield where, _ABSENT, want
            else:
                yield from _differences(where, found[key], want)
    elif isinstance(expected, list) and isinstance(found, list) and len(found) == len(expected):
        for k, (got, want) in enumerate(zip(found, expected, strict=True)):
            yield from _differences(f"{path}[{k}]", got, want)
    elif found != expected or type(found) is not type(expected):
        yield path, found, expected


# -- damaged shards ---------------------------------------------------------------------------------


def damaged(kind: str, path: Path, exc: Exception) -> pa.ArrowInvalid:
    """The error a malformed shard raises: an ArrowException, as the read side expects of any format."""
    import pyarrow as pa

    return pa.ArrowInvalid(f"{path.name}: not a valid {kind} shard ({type(exc).__name__}: {exc})")


# What decoding a malformed shard of a hand-written format raises; a reader turns them into ``damaged``.
MALFORMED = (ValueError, IndexError, KeyError, TypeError, AttributeError)
