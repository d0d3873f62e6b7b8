"""Reading the inputs: each source as batches of raw records, in a fixed order, numbered from 0.

JSON lines are handed on as raw bytes so that decoding and validation run in the worker processes;
other formats give dicts. Every record gets its global ``sample_index``: sources in their sorted
order, records in file order, every record counted.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import io
import json
import lzma
import os
import re
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from packcli.errors import InputError, raise_if_stopped
from packcli.io.sources import InputSource, RawBatch, is_uri, open_uri

# Record counts by (path, size, mtime_ns): a count made ahead of time (while the tokenizer loads) is
# not made again when the tokenizing starts.
_COUNTED: dict[tuple[str, int, int], int] = {}


def count_records(source: InputSource) -> int | None:
    """Return the number of records of a source when it is cheap to know (for progress), else None."""
    try:
        if source.kind == "jsonl" and source.compression is None:
            st = os.stat(source.path)
            key = (os.path.abspath(source.path), st.st_size, st.st_mtime_ns)
            if key not in _COUNTED:
                n = 0
                with open(source.path, "rb") as fh:
                    for i, line in enumerate(fh):
                        n += bool(line.strip())
                        if not i & 0xFFFF:
                            raise_if_stopped()
                _COUNTED[key] = n
            return _COUNTED[key]
        if source.kind == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(source.path).metadata.num_rows
    except Exception:  # a file that cannot be read is reported by the reader, with its reason
        return None
    return None


def read_batches(sources: list[InputSource], batch_size: int = 1000, limit: int | None = None) -> Iterator[RawBatch]:
    """Yield the records of all sources in order, in batches, numbering them from 0.

    With ``limit``, only the first ``limit`` records (over all sources, in that order) are read.
    """
    index = 0
    for source in sources:
        if limit is not None and index >= limit:
            return
        index = yield from number_batches(_read_source(source, batch_size), index, limit)


def number_batches(batches: Iterator[RawBatch], index: int, limit: int | None) -> Generator[RawBatch, None, int]:
    """Yield ``batches`` numbered on from ``index`` (their ``first_index``), cut at ``limit`` records.

    Returns the index after the last record yielded.
    """
    for batch in batches:
        if limit is not None and index + len(batch.items) > limit:
            keep = limit - index
            batch.items, batch.positions = batch.items[:keep], batch.positions[:keep]
            batch.errors = [e for e in batch.errors if e[0] in set(batch.positions)]
        batch.first_index = index
        index += len(batch.items)
        if batch.items:
            yield batch
        if limit is not None and index >= limit:
            break
    return index


# Compressed bytes read at a time, and decompressed bytes made at most by one call (zstd's decompressor
# has no such bound: it is given ZSTD_FEED bytes at a time, so that one call's output stays small even
# for data that compresses extremely well).
COMPRESSED_CHUNK = 1 << 16
MAX_OUTPUT = 1 << 20
ZSTD_FEED = 1 << 12


def _decompressor(compression: str) -> Any:
    """A new decompressor of one gzip member, bz2 or xz stream, or zstd frame."""
    if compression == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)  # the gzip header and trailer (CRC-32, size) checked
    if compression == "bz2":
        return bz2.BZ2Decompressor()
    if compression == "xz":
        return lzma.LZMADecompressor(lzma.FORMAT_AUTO)
    try:
        import zstandard
    except ImportError as exc:  # a dependency of packcli: missing only from a broken install
        raise InputError("reading .zst needs the zstandard package; pip install zstandard") from exc
    return zstandard.ZstdDecompressor().decompressobj()


class Decompressed(io.RawIOBase):
    """The decompressed bytes of a gzip, bz2, xz or zstd file, read as a stream.

    Concatenated members (gzip), streams (bz2, xz) and frames (zstd) are read one after the other, as
    their tools do. Every member must end: a file that stops inside one (a broken download or copy) is
    an InputError once its last whole bytes are read, never a shorter file; so are damaged bytes and
    bytes after the last member that are not one. Python's readers of these formats miss some of this
    (a zstd frame cut between blocks, garbage after a bz2 or xz stream), hence this one reader for all.
    """

    def __init__(self, raw: Any, compression: str, name: str) -> None:
        super().__init__()
        self._raw = raw
        self._compression = compression
        self._name = name
        self._member: Any = None  # the decompressor of the member being read; None between members
        self._fed = False  # whether the member has taken bytes without an error
        self._members = 0
        self._input = b""  # compressed bytes read and not yet given to a decompressor
        self._output = b""  # decompressed bytes not yet returned
        self._source_done = False
        self._capped = False  # the last gzip call gave MAX_OUTPUT bytes (it may have more without input)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._output:
            if not self._step():
                return 0
        n = min(len(buffer), len(self._output))
        buffer[:n] = self._output[:n]
        self._output = self._output[n:]
        return n

    def _wants_input(self) -> bool:
        if self._input:
            return False
        if self._member is None:
            return True
        # A call whose output reached MAX_OUTPUT may have more to give from the input it took: bz2 and xz
        # say so (needs_input); zlib may, when its last call filled the bound exactly.
        if self._compression == "gzip":
            return not self._capped
        return bool(getattr(self._member, "needs_input", True))

    def _step(self) -> bool:
        """Decompress some more into ``_output``; return False at the end of the data."""
        if self._wants_input():
            if not self._source_done:
                raise_if_stopped()
                self._input = self._raw.read(COMPRESSED_CHUNK)
                self._source_done = not self._input
            if self._source_done and not self._input:
                if self._member is not None:
                    raise self._error(
                        f"the {self._compression} data is cut off (the file ends inside "
                        f"{_MEMBER[self._compression]} {self._members}); the file is incomplete"
                    )
                return False
        if self._member is None:
            self._member, self._fed = _decompressor(self._compression), False
            self._members += 1
        member = self._member
        try:
            if self._compression == "gzip":
                self._output = member.decompress(self._input, MAX_OUTPUT)
                self._input = member.unconsumed_tail
                self._capped = len(self._output) >= MAX_OUTPUT
            elif self._compression == "zstd":
                data, self._input = self._input[:ZSTD_FEED], self._input[ZSTD_FEED:]
                self._output = member.decompress(data)
            else:
                data, self._input = self._input, b""
                self._output = member.decompress(data, MAX_OUTPUT)
        except _DECODE_ERRORS as exc:
            if self._members > 1 and not self._fed:
                raise self._error(
                    f"after {_MEMBER[self._compression]} {self._members - 1} the file holds bytes that are not "
                    f"{self._compression} data; it is damaged, or other data was appended to it"
                ) from exc
            raise self._error(f"the {self._compression} data is damaged ({_first(exc)})") from exc
        self._fed = True
        if member.eof:
            # What follows the member: zlib's unused_data is all of it (its unconsumed_tail repeats it);
            # zstd's is the rest of the bytes given, before those not given yet.
            self._input = member.unused_data + (self._input if self._compression == "zstd" else b"")
            self._member = None
        return True

    def _error(self, what: str) -> InputError:
        return InputError(f"{self._name}: cannot decompress: {what}: check the file")

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


_MEMBER = {"gzip": "member", "bz2": "stream", "xz": "stream", "zstd": "frame"}


def _decode_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError, EOFError, lzma.LZMAError, zlib.error]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


_DECODE_ERRORS = _decode_errors()


def _decompressed(raw: Any, compression: str, name: str) -> Any:
    return io.BufferedReader(Decompressed(raw, compression, name), CHUNK)


def parquet_file(path: str) -> Any:
    """A pyarrow ParquetFile of a local path or a URI."""
    import pyarrow.parquet as pq

    if is_uri(path):
        from pyarrow import fs as pafs

        filesystem, where = pafs.FileSystem.from_uri(path)
        return pq.ParquetFile(where, filesystem=filesystem)
    return pq.ParquetFile(path)


@contextlib.contextmanager
def open_input(source: InputSource) -> Iterator[Any]:
    """Open a file source for reading bytes, decompressing it as a stream when it is compressed."""
    raw = open_uri(source.path) if is_uri(source.path) else open(source.path, "rb")  # noqa: SIM115
    fh = _decompressed(raw, source.compression, source.display) if source.compression else raw
    try:
        yield fh
    finally:
        fh.close()
        raw.close()


def _first(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _read_source(source: InputSource, batch_size: int) -> Iterator[RawBatch]:
    try:
        if source.kind == "jsonl":
            yield from _read_json_lines(source, batch_size)
        elif source.kind == "json":
            yield from _read_json(source, batch_size)
        else:
            yield from _read_tabular(source, batch_size)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read ({exc.strerror or exc}); check the file") from exc


def _read_json_lines(source: InputSource, batch_size: int) -> Iterator[RawBatch]:
    path = source.display
    items: list[bytes] = []
    positions: list[int] = []
    empty = True
    with open_input(source) as fh:
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


CHUNK = 1 << 20
_STRUCTURE = re.compile(r'["\[\]{}]')
_IN_STRING = re.compile(r'["\\]')
_SCALAR_END = re.compile(r"[\s,\]]")


class _TextStream:
    """A source's text, decoded from UTF-8 by chunks: a window ``buf`` that grows at its end on demand."""

    def __init__(self, fh: Any, name: str) -> None:
        self.fh = fh
        self.name = name
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.eof = False
        self.bytes_read = 0
        self.first = True
        self.bom = 0  # bytes of the byte order mark skipped at the start
        self.dropped_bytes = 0  # bytes of the text dropped from the start of ``buf``

    def more(self) -> bool:
        """Append the next chunk to ``buf``; return False at the end of the stream."""
        if self.eof:
            return False
        data = self.fh.read(CHUNK)
        if self.first and data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8) :]  # Windows exports start with one
            self.bom = len(codecs.BOM_UTF8)
        self.first = False
        try:
            self.buf += self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            at = self.bytes_read + exc.start
            raise InputError(f"{self.name}: byte {at} is not UTF-8; re-encode the file as UTF-8") from exc
        self.bytes_read += len(data)
        self.eof = not data
        return True

    def drop(self, pos: int) -> int:
        """Forget the text before ``pos`` (already read); return where ``pos`` now is (0)."""
        self.dropped_bytes += len(self.buf[:pos].encode("utf-8"))
        self.buf = self.buf[pos:]
        return 0

    def byte_offset(self, pos: int) -> int:
        """Return the offset in the file's bytes (from 0, a byte order mark counted) of ``buf[pos]``."""
        return self.bom + self.dropped_bytes + len(self.buf[:pos].encode("utf-8"))


def _value_end(stream: _TextStream, pos: int) -> int | None:
    """Return the end of the JSON value that starts at ``pos`` (reading on as needed), or None if cut off.

    Only brackets and strings are followed, so a value nested deeper than the decoder can go is still
    delimited, and the scan goes on across chunks without starting over.
    """
    first = stream.buf[pos]
    if first not in '[{"':
        while True:
            m = _SCALAR_END.search(stream.buf, pos)
            if m:
                return m.start()
            if not stream.more():
                return len(stream.buf)
    depth = 0
    in_string = False
    i = pos
    while True:
        if in_string:
            m = _IN_STRING.search(stream.buf, i)
            if m is None:
                i = len(stream.buf)
            elif m.group() == "\\":
                if m.end() >= len(stream.buf):  # the escaped character is in the next chunk
                    i = m.start()
                    if not stream.more():
                        return None
                    continue
                i = m.end() + 1
                continue
            else:
                in_string = False
                i = m.end()
                if depth == 0:
                    return i
                continue
        else:
            m = _STRUCTURE.search(stream.buf, i)
            if m is None:
                i = len(stream.buf)
            else:
                c = m.group()
                i = m.end()
                if c == '"':
                    in_string = True
                elif c in "[{":
                    depth += 1
                else:
                    depth -= 1
                    if depth == 0:
                        return i
                continue
        if not stream.more():
            return None


def _skip_space(stream: _TextStream, pos: int) -> int:
    while True:
        while pos < len(stream.buf) and stream.buf[pos] in " \t\r\n":
            pos += 1
        if pos < len(stream.buf) or not stream.more():
            return pos


def _read_json(source: InputSource, batch_size: int) -> Iterator[RawBatch]:
    """Read a JSON array of records element by element, as a stream, or fall back to JSON lines.

    Elements are delimited by a scan of brackets and strings and decoded one at a time, so that memory
    holds one record (and a chunk), never the whole file, and a file cut off in the middle of a record
    (a broken download) still gives every complete record before the cut; the cut itself is reported
    as one bad record.
    """
    path = source.display
    with open_input(source) as fh:
        stream = _TextStream(fh, path)
        pos = _skip_space(stream, 0)
        if pos >= len(stream.buf):
            raise InputError(f"{path}: the file is empty; remove it from the inputs")
        if stream.buf[pos] != "[":
            _refuse_object_over_lines(stream, pos, path)
            lines_mode = True
        else:
            lines_mode = False
            yield from _read_json_array(stream, pos + 1, path, batch_size)
    if lines_mode:
        # A .json file holding JSON lines, as many exports do.
        yield from _read_json_lines(source, batch_size)


_DECODER = json.JSONDecoder()


def _refuse_object_over_lines(stream: _TextStream, pos: int, path: str) -> None:
    """Raise InputError when a .json file that is no array starts with one object spread over lines.

    Read as JSON lines, a pretty-printed object (``json.dump(record, f, indent=2)``, or ``jq`` without
    ``-c``) is invalid JSON at line 1, which hides what the file should be. Only the first chunk is
    looked at; an object longer than that is still known by a first line that is only ``{``.
    """
    if stream.buf[pos] != "{":
        return
    newline = stream.buf.find("\n", pos)
    if newline == -1:
        return
    try:
        value, end = _DECODER.raw_decode(stream.buf, pos)
        spread = isinstance(value, dict) and end > newline
    except (ValueError, RecursionError):  # not whole in the chunk, or a bad record: JSON lines report it
        spread = stream.buf[pos:newline].strip() == "{"
    if spread:
        raise InputError(
            f"{path}: the file starts with a JSON object spread over several lines; a .json file must be an "
            "array of records or JSON lines (one record per line): put the records in [ ] or write each on one line"
        )


def _decode_whole(stream: _TextStream, pos: int) -> tuple[Any, int] | None:
    """Decode the element at ``pos`` when it ends inside the window (not at its edge); else None.

    None (cut by the window's edge, broken, or nested too deep) sends the element to the scan of
    brackets and strings, which reads on as far as it goes and reports what is wrong.
    """
    try:
        value, end = _DECODER.raw_decode(stream.buf, pos)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer too long to convert
        return None
    return (value, end) if end < len(stream.buf) or stream.eof else None


def _read_json_array(stream: _TextStream, pos: int, path: str, batch_size: int) -> Iterator[RawBatch]:
    record_no = 0
    batch = RawBatch(path, 0, [], [])
    while True:
        if pos > CHUNK:
            pos = stream.drop(pos)
        pos = _skip_space(stream, pos)
        if pos < len(stream.buf) and stream.buf[pos] == "]":
            break
        if pos >= len(stream.buf):
            batch.errors.append((record_no + 1, "truncated_file", "the JSON array is cut off (missing ']')"))
            batch.items.append(None)
            batch.positions.append(record_no + 1)
            break
        record_no += 1
        fast = _decode_whole(stream, pos)
        end: int | None
        if fast is not None:  # the common case: the element is whole in the window
            value, end = fast
        else:
            end = _value_end(stream, pos)
            if end is None:
                batch.errors.append((record_no, "truncated_file", "the JSON array is cut off in this record"))
                batch.items.append(None)
                batch.positions.append(record_no)
                break
            try:
                value = json.loads(stream.buf[pos:end])
            except json.JSONDecodeError as exc:
                # The element's end is known (its brackets and strings balance): it is one bad record,
                # and the elements after it are still read (stopping here lost them uncounted).
                where = stream.byte_offset(pos + exc.pos)
                batch.errors.append(
                    (record_no, "invalid_json", f"invalid JSON ({exc.msg} at byte {where} of the file)")
                )
                value = None
            except ValueError:  # an integer past Python's digit limit: this record only, as below
                from packcli.records.checks import integer_too_long

                err = integer_too_long()
                batch.errors.append((record_no, err.reason, err.detail))
                value = None
            except RecursionError:
                # The decoder recurses per nesting level: this element is one bad record, and the
                # elements after it are still read.
                from packcli.records.checks import too_deep

                err = too_deep()
                batch.errors.append((record_no, err.reason, err.detail))
                value = None
        pos = _skip_space(stream, end)
        batch.items.append(value)
        batch.positions.append(record_no)
        if pos < len(stream.buf) and stream.buf[pos] == ",":
            pos += 1
        elif pos < len(stream.buf) and stream.buf[pos] != "]":
            # Without this check, two records run together would be read as one and the rest skipped.
            found = stream.buf[pos : pos + 20].split("\n")[0]
            raise InputError(
                f"{path}: record {record_no} of the JSON array is followed by '{found}' at byte "
                f"{stream.byte_offset(pos)}, not by ',' or ']'; fix the file (a missing ','?)"
            )
        if len(batch.items) >= batch_size:
            yield batch
            batch = RawBatch(path, 0, [], [])
    if pos < len(stream.buf) and stream.buf[pos] == "]":
        after = _skip_space(stream, pos + 1)
        if after < len(stream.buf):
            # As `cat a.json b.json` makes: everything after the first array would be lost.
            raise InputError(
                f"{path}: the file has data after its closing ] (at byte {stream.byte_offset(after)}, after "
                f"record {record_no}): concatenated JSON arrays? merge them into one array or convert to JSON lines"
            )
    if batch.items:
        yield batch
    elif record_no == 0 and not batch.errors:
        raise InputError(f"{path}: the JSON array is empty; remove it from the inputs")


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
            yield from parquet_file(source.path).iter_batches(batch_size=batch_size)
        elif source.kind == "csv":
            yield from _read_csv(source, batch_size)
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


# Bytes of CSV text parsed at a time.
CSV_BLOCK = 1 << 22


def _read_csv(source: InputSource, batch_size: int) -> Iterator[Any]:
    import csv

    import pyarrow as pa
    import pyarrow.csv as pacsv

    # Every column as text: a CSV cell's type is what the record format says, not a guess.
    with open_input(source) as fh:
        # utf-8-sig: a byte order mark is not part of the first column's name.
        header = fh.readline().decode("utf-8-sig", errors="replace").strip()
    if not header:
        raise InputError(f"{source.display}: the file is empty; remove it from the inputs")
    names = next(iter(csv.reader([header])))
    convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in names})
    # Quoted cells may hold newlines (RFC 4180): blocks must not be cut at those. Measured no slower on
    # text without them.
    parse = pacsv.ParseOptions(newlines_in_values=True)
    with open_input(source) as fh:
        read = pacsv.ReadOptions(block_size=CSV_BLOCK)
        reader = pacsv.open_csv(fh, read_options=read, parse_options=parse, convert_options=convert)
        for batch in reader:
            yield from _slices(batch, batch_size)


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


_REACHABLE: dict[tuple[str, str], bool] = {}


def hub_reachable(timeout: float = 3.0) -> bool:
    """Return whether the Hub answers at all (offline mode and failed name lookups say no at once).

    Asked once per process (for each HF_HUB_OFFLINE and HF_ENDPOINT): a Hub that does not answer
    costs up to ``timeout`` seconds.
    """
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower()
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if offline in ("1", "true", "yes", "on"):
        return False
    if (offline, endpoint) not in _REACHABLE:
        import socket
        from urllib.parse import urlparse

        host = urlparse(endpoint).hostname or "huggingface.co"
        try:
            with socket.create_connection((host, 443), timeout=timeout):
                _REACHABLE[offline, endpoint] = True
        except OSError:
            _REACHABLE[offline, endpoint] = False
    return _REACHABLE[offline, endpoint]


def _read_hub(source: InputSource, batch_size: int) -> Iterator[Any]:
    """Load a Hub dataset with ``datasets``; without the Hub, from the local Hugging Face cache only."""
    online = hub_reachable()
    try:
        import datasets

        with _offline(not online):
            ds = datasets.load_dataset(source.path, split=source.split)
    except Exception as exc:  # the Hub client raises many unrelated types for one failure
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if not online:
            raise InputError(
                f"{source.display}: the Hugging Face Hub cannot be reached and the dataset is not in the local "
                f"cache ({first}); load it once where there is network, or save it with datasets.save_to_disk "
                "and pass the directory"
            ) from exc
        raise InputError(
            f"{source.display}: cannot load the Hub dataset ({first}); check the name and split, "
            "the network, or save it locally with datasets.save_to_disk and pass the directory"
        ) from exc
    yield from ds.data.to_batches(max_chunksize=batch_size)


@contextlib.contextmanager
def _offline(offline: bool) -> Iterator[None]:
    """Run ``datasets`` in offline mode (as HF_HUB_OFFLINE=1 does): cached datasets load, nothing waits on the net."""
    if not offline:
        yield
        return
    import datasets.config
    import huggingface_hub.constants as hub_constants
    from datasets.utils import logging as datasets_logging

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE, datasets_logging.get_verbosity())
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    # datasets logs that it uses the cached version; packcli says so once, in its own warning.
    datasets_logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved[:2]
        datasets_logging.set_verbosity(saved[2])
