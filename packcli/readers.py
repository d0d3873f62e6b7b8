"""Reading the inputs: each source as batches of raw records, in a fixed order, numbered from 0.

JSON lines are handed on as raw bytes so that decoding and validation run in the worker processes;
other formats give dicts. Every record gets its global ``sample_index``: sources in their sorted
order, records in file order, every record counted.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packcli.errors import InputError
from packcli.sources import InputSource, RawBatch


def count_records(source: InputSource) -> int | None:
    """Return the number of records of a source when it is cheap to know (for progress), else None."""
    try:
        if source.kind == "jsonl":
            with open(source.path, "rb") as fh:
                return sum(1 for line in fh if line.strip())
        if source.kind == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(source.path).metadata.num_rows
    except Exception:  # a file that cannot be read is reported by the reader, with its reason
        return None
    return None


def read_batches(sources: list[InputSource], batch_size: int = 1000) -> Iterator[RawBatch]:
    """Yield the records of all sources in order, in batches, numbering them from 0."""
    index = 0
    for source in sources:
        for batch in _read_source(source, batch_size):
            batch.first_index = index
            index += len(batch.items)
            yield batch


def _read_source(source: InputSource, batch_size: int) -> Iterator[RawBatch]:
    try:
        if source.kind == "jsonl":
            yield from _read_json_lines(source.path, batch_size)
        elif source.kind == "json":
            yield from _read_json(source.path, batch_size)
        else:
            yield from _read_tabular(source, batch_size)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc


def _read_json_lines(path: str, batch_size: int) -> Iterator[RawBatch]:
    items: list[bytes] = []
    positions: list[int] = []
    empty = True
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, start=1):
            if line_no == 1 and line.startswith(codecs.BOM_UTF8):
                line = line[len(codecs.BOM_UTF8) :]  # Windows exports start with one
            if not line.strip():
                continue
            empty = False
            items.append(line)
            positions.append(line_no)
            if len(items) >= batch_size:
                yield RawBatch(path, 0, items, positions, raw_lines=True)
                items, positions = [], []
    if items:
        yield RawBatch(path, 0, items, positions, raw_lines=True)
    if empty:
        raise InputError(f"{path}: the file is empty; remove it from the inputs")


def _read_json(path: str, batch_size: int) -> Iterator[RawBatch]:
    """Read a JSON array of records element by element, or fall back to JSON lines.

    Elements are decoded one at a time, so a file cut off in the middle of a record (a broken download)
    still gives every complete record before the cut; the cut itself is reported as one bad record.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]  # Windows exports start with one
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: byte {exc.start} is not UTF-8; re-encode the file as UTF-8") from exc
    stripped = text.lstrip()
    if not stripped:
        raise InputError(f"{path}: the file is empty; remove it from the inputs")
    if not stripped.startswith("["):
        # A .json file holding JSON lines, as many exports do.
        lines = data.splitlines(keepends=True)
        items = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            yield RawBatch(path, 0, [c[1] for c in chunk], [c[0] for c in chunk], raw_lines=True)
        return
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    end = len(text)
    record_no = 0
    batch = RawBatch(path, 0, [], [])
    while True:
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos < end and text[pos] == "]":
            break
        if pos >= end:
            batch.errors.append((record_no + 1, "truncated_file", "the JSON array is cut off (missing ']')"))
            batch.items.append(None)
            batch.positions.append(record_no + 1)
            break
        record_no += 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            batch.errors.append((record_no, "truncated_file", f"the JSON array is cut off or broken ({exc.msg})"))
            batch.items.append(None)
            batch.positions.append(record_no)
            break
        except RecursionError:
            # The decoder recurses per nesting level: this element is one bad record, and the
            # elements after it are still read.
            from packcli.records import too_deep

            err = too_deep()
            batch.errors.append((record_no, err.reason, err.detail))
            value, pos = None, _skip_value(text, pos)
        batch.items.append(value)
        batch.positions.append(record_no)
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos < end and text[pos] == ",":
            pos += 1
        if len(batch.items) >= batch_size:
            yield batch
            batch = RawBatch(path, 0, [], [])
    if batch.items:
        yield batch
    elif record_no == 0 and not batch.errors:
        raise InputError(f"{path}: the JSON array is empty; remove it from the inputs")


def _skip_value(text: str, pos: int) -> int:
    """Return the position just after the JSON array or object that starts at ``pos`` (no recursion)."""
    depth = 0
    in_string = False
    i = pos
    end = len(text)
    while i < end:
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return end


def _read_tabular(source: InputSource, batch_size: int) -> Iterator[RawBatch]:
    record_no = 0
    for record_batch in _arrow_batches(source, batch_size):
        n = record_batch.num_rows
        if n == 0:
            continue
        rows = record_batch.to_pylist()
        yield RawBatch(source.display, 0, rows, list(range(record_no + 1, record_no + n + 1)))
        record_no += n
    if record_no == 0:
        raise InputError(f"{source.display}: the input holds no records; remove it from the inputs")


def _arrow_batches(source: InputSource, batch_size: int) -> Iterator[Any]:
    import pyarrow as pa

    try:
        if source.kind == "parquet":
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(source.path).iter_batches(batch_size=batch_size)
        elif source.kind == "csv":
            import pyarrow.csv as pacsv

            # Every column as text: a CSV cell's type is what the record format says, not a guess.
            with open(source.path, "rb") as fh:
                # utf-8-sig: a byte order mark is not part of the first column's name.
                header = fh.readline().decode("utf-8-sig", errors="replace").strip()
            if not header:
                raise InputError(f"{source.path}: the file is empty; remove it from the inputs")
            names = next(iter(__import__("csv").reader([header])))
            convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in names})
            reader = pacsv.open_csv(
                source.path,
                read_options=pacsv.ReadOptions(block_size=1 << 22),
                convert_options=convert,
            )
            for batch in reader:
                yield from _slices(batch, batch_size)
        elif source.kind == "arrow":
            yield from _read_arrow_file(source.path, batch_size)
        elif source.kind == "saved_dataset":
            state = json.loads((Path(source.path) / "state.json").read_text())
            for entry in state.get("_data_files", []):
                yield from _read_arrow_file(str(Path(source.path) / entry["filename"]), batch_size)
        elif source.kind == "hub":
            yield from _read_hub(source, batch_size)
    except (pa.ArrowInvalid, pa.ArrowException) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{source.display}: cannot be read as {source.kind} ({message}); check the file") from exc


def _slices(batch: Any, batch_size: int) -> Iterator[Any]:
    for start in range(0, batch.num_rows, batch_size):
        yield batch.slice(start, batch_size)


def _read_arrow_file(path: str, batch_size: int) -> Iterator[Any]:
    import pyarrow as pa

    with pa.memory_map(path) as mm:
        try:
            reader = pa.ipc.open_file(mm)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            mm.seek(0)
            batches = iter(pa.ipc.open_stream(mm))
        for batch in batches:
            yield from _slices(batch, batch_size)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Return whether the Hub answers at all (offline mode and failed name lookups say no at once)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _read_hub(source: InputSource, batch_size: int) -> Iterator[Any]:
    if not hub_reachable():
        raise InputError(
            f"{source.display}: the Hugging Face Hub cannot be reached; save the dataset with "
            "datasets.save_to_disk where there is network and pass its directory"
        )
    try:
        import datasets

        ds = datasets.load_dataset(source.path, split=source.split)
    except Exception as exc:  # the Hub client raises many unrelated types for one failure
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(
            f"{source.display}: cannot load the Hub dataset ({first}); check the name and split, "
            "the network, or save it locally with datasets.save_to_disk and pass the directory"
        ) from exc
    yield from ds.data.to_batches(max_chunksize=batch_size)
