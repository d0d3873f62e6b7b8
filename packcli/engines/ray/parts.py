"""The inputs cut into parts that tasks on other machines read: JSON lines by byte range, Parquet by row group.

A part is read by the task that tokenizes it, never by the driver. Its records are numbered from 0 and
its positions (lines, or records) from 1 *within the part*; the driver, which takes the parts' results
in input order, adds the records and lines of the parts before (prefix sums), so that ``sample_index``,
line numbers and error messages are those of the local engine's sequential reader
(``packcli.io.readers``). A source that cannot be cut (a JSON array, CSV, a compressed file, an Arrow file,
a saved dataset, a Hub dataset) is one part, read by the local engine's own reader.

JSON lines: a part owns the lines that *start* in its byte range ``[start, end)``; it skips the line
that starts before ``start`` and reads on past ``end`` to finish its last line. Blank lines are not
records but count as lines, so a part reports how many lines it passed (``units``).
"""

from __future__ import annotations

import codecs
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from packcli.errors import InputError, first_line
from packcli.io import readers
from packcli.io.readers.tabular import raw_batches
from packcli.io.sources import InputSource, RawBatch
from packcli.io.uri import input_size, is_uri, open_uri

# Bytes of JSON lines (or Parquet) per part at most: a part is the unit of work of one tokenizer call,
# and one token segment. Smaller inputs are cut into about PARTS_PER_CPU parts per CPU of the cluster,
# parts of no less than MIN_PART_BYTES, so that every actor has work and a slow one holds up little.
PART_BYTES = 8 << 20
MIN_PART_BYTES = 256 << 10
PARTS_PER_CPU = 4


def part_bytes(sources: list[InputSource], cpus: int) -> int:
    """The size of a part for these inputs on a cluster of ``cpus`` CPUs (file sizes only are read)."""
    total = 0
    for source in sources:
        if source.kind in ("jsonl", "parquet"):
            with contextlib.suppress(OSError, ValueError):
                total += input_size(source.path)
    return min(PART_BYTES, max(MIN_PART_BYTES, total // max(1, PARTS_PER_CPU * cpus)))


@dataclass(frozen=True)
class Part:
    """One piece of one source: a byte range of JSON lines, a range of Parquet row groups, or all of it."""

    number: int
    source: InputSource
    fmt: str | None
    kind: str  # lines | row_groups | whole
    start: int = 0
    end: int = 0
    last_of_source: bool = True
    max_records: int | None = None  # --limit: read at most this many records
    directory: str | None = None  # where its tokens are written: a cache part's own directory (else the store's)


def input_cuts(source: InputSource, cpus: int) -> list[list[Any]]:
    """How one input is cut into parts when each part is a cache part (``packcli.store.parts``): by its
    own size alone, never the other inputs', so a run that adds an input finds the parts of the others.

    Each cut (``[kind, start, end]``) is in its part's cache key: an input of over
    ``PART_BYTES * PARTS_PER_CPU * cpus`` bytes is cut the same on any cluster; a smaller one into about
    ``PARTS_PER_CPU`` parts a CPU, as ``part_bytes`` cuts all the inputs of a run.
    """
    size = 0
    if source.kind in ("jsonl", "parquet"):
        with contextlib.suppress(OSError, ValueError):
            size = input_size(source.path)
    each = min(PART_BYTES, max(MIN_PART_BYTES, size // max(1, PARTS_PER_CPU * cpus)))
    return [list(piece) for piece in _pieces(source, each)]


def cut_parts(source: InputSource, fmt: str | None, cuts: list[list[Any]], first: int, number: int) -> list[Part]:
    """The parts of ``source`` for its cuts from ``first`` on, numbered from ``number``."""
    return [
        Part(number + k, source, fmt, str(kind), int(start), int(end), last_of_source=first + k == len(cuts) - 1)
        for k, (kind, start, end) in enumerate(cuts[first:])
    ]


def make_parts(sources: list[InputSource], formats: dict[str, str | None], part_bytes: int) -> list[Part]:
    """Cut the sources into parts, in input order. Only file sizes and Parquet footers are read here."""
    parts: list[Part] = []
    for source in sources:
        fmt = formats[source.display]
        pieces = _pieces(source, part_bytes)
        for k, (kind, start, end) in enumerate(pieces):
            parts.append(Part(len(parts), source, fmt, kind, start, end, last_of_source=k == len(pieces) - 1))
    return parts


def _pieces(source: InputSource, part_bytes: int) -> list[tuple[str, int, int]]:
    if source.kind == "jsonl" and source.compression is None:
        try:
            size = input_size(source.path)
        except (OSError, ValueError):
            return [("whole", 0, 0)]  # the reader reports it, in its turn
        n = max(1, -(-size // max(1, part_bytes)))
        step = -(-size // n) if size else 0
        return [("lines", k * step, min(size, (k + 1) * step)) for k in range(n)]
    if source.kind == "parquet":
        try:
            meta = readers.parquet_file(source.path).metadata
        except Exception:  # not a Parquet file: the reader reports it, with the local engine's message
            return [("whole", 0, 0)]
        groups = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
        if not groups:
            return [("whole", 0, 0)]
        out, first, size = [], 0, 0
        for i, group_bytes in enumerate(groups):
            size += group_bytes
            if size >= part_bytes or i == len(groups) - 1:
                out.append(("row_groups", first, i + 1))
                first, size = i + 1, 0
        return out
    return [("whole", 0, 0)]


class Units:
    """How many lines (JSON lines) or records a part's reading passed: what the parts after it add."""

    def __init__(self) -> None:
        self.value = 0


def read_part(part: Part, batch_size: int, units: Units) -> Iterator[RawBatch]:
    """Yield the records of a part in batches, numbered within the part (``first_index`` from 0).

    Raise InputError as the local reader does, after the batches before the problem.
    """
    if part.kind == "lines":
        batches = _read_line_range(part, batch_size, units)
    elif part.kind == "row_groups":
        batches = _read_row_groups(part, batch_size, units)
    else:
        batches = readers.read_source(part.source, batch_size)
    yield from readers.number_batches(batches, 0, part.max_records)


def count_part(part: Part) -> int:
    """The number of records of a part (for --limit); a part that cannot be read counts what it gave."""
    records = 0
    try:
        for batch in read_part(part, 1024, Units()):
            records += len(batch.items)
    except InputError:
        pass
    return records


def _read_line_range(part: Part, batch_size: int, units: Units) -> Iterator[RawBatch]:
    path = part.source.display
    items: list[bytes] = []
    positions: list[int] = []
    try:
        path_or_uri = part.source.path
        with open_uri(path_or_uri, random_access=True) if is_uri(path_or_uri) else open(path_or_uri, "rb") as fh:
            pos = part.start
            if pos > 0:
                fh.seek(pos - 1)
                pos += len(fh.readline()) - 1  # the line that started before this part is the part before's
            line_no = 0
            while pos < part.end:
                line = fh.readline()
                if not line:
                    break
                line_no += 1
                pos += len(line)
                if part.start == 0 and line_no == 1 and line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8) :]  # Windows exports start with one
                if not line.strip():
                    continue
                items.append(line)
                positions.append(line_no)
                if len(items) >= batch_size:
                    yield RawBatch(path, 0, items, positions, raw_lines=True)
                    items, positions = [], []
            units.value = line_no
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from exc
    if items:
        yield RawBatch(path, 0, items, positions, raw_lines=True)


def _read_row_groups(part: Part, batch_size: int, units: Units) -> Iterator[RawBatch]:
    import pyarrow as pa

    source = part.source
    try:
        groups = list(range(part.start, part.end))
        record_batches = readers.parquet_file(source.path).iter_batches(batch_size=batch_size, row_groups=groups)
        record_no = yield from raw_batches(source, record_batches)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        message = first_line(exc, limit=None)
        raise InputError(f"{source.display}: cannot be read as {source.kind} ({message}); check the file") from exc
    units.value = record_no


def empty_source_error(source: InputSource) -> InputError:
    """The local reader's error for a source that holds no record at all (only cut sources get here)."""
    if source.kind == "jsonl":
        return InputError(f"{source.display}: the file is empty; remove it from the inputs")
    return InputError(f"{source.display}: the input holds no records; remove it from the inputs")


def shift(result: dict[str, Any], first_index: int, first_unit: int) -> None:
    """Make a part's numbering global: records after ``first_index``, positions after ``first_unit``."""
    for reject in result["rejects"]:
        reject["sample_index"] += first_index
        reject["position"] += first_unit
