"""JSON inputs: JSON lines (handed on as raw bytes, decoded in the workers) and JSON arrays, read as a stream."""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packcli.errors import InputError
from packcli.io.readers.compressed import open_input, read_rest
from packcli.io.readers.reading import Reading, first_records
from packcli.io.sources import InputSource, RawBatch
from packcli.records.checks import found_at, json_value_end


@dataclass
class PartEnds:
    """What one read of an input learns of its parts, as it reads them (a JSON lines file's; the other
    kinds' are cut by their records: ``io.readers._marked``).

    A part ends with its ``every``-th record, or with the first record that takes it to ``size`` bytes
    or more (blank lines before a record count in its part), or with the input: cut by what the input
    holds up to there, so a file that grows or is edited at its end keeps the parts before.
    ``ends[k]``: the hash of the input's (decompressed) bytes from its start through part ``k``'s last
    record; ``records[k]`` its records; ``whole``: the hash of all its (decompressed) bytes; ``file``: the
    hash of the file's bytes (``io.fingerprint``'s: ``whole`` for a file not compressed). A part's end
    is known before the batch that ends it is handed over, and no batch holds records of two parts.
    """

    every: int
    size: int
    ends: list[str] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    whole: str | None = None
    file: str | None = None
    # How far the read is, as of the last batch handed over: the (decompressed) bytes and the records.
    passed: tuple[int, int] = (0, 0)


def read_json_lines(
    source: InputSource,
    batch_size: int,
    digests: dict[str, str] | None = None,
    ends: PartEnds | None = None,
    records: int | None = None,
) -> Iterator[RawBatch]:
    """Yield a JSON lines file's records in batches of raw lines (blank lines skipped).

    ``digests`` receives the hash of the file read through, by its path. With ``ends``, the read also
    cuts the input into parts and hashes where each ends (``PartEnds``). ``records``: the first records
    only are handed over; with ``digests``, the rest of the file is read for its hash before the last
    batch is (a reader that stops there has the hash).
    """
    if ends is not None:
        yield from _read_marking(source, batch_size, digests, ends)
        return
    with open_input(source, digests) as fh:
        yield from _lines_read(source.display, fh, fh, batch_size, records, digests is not None)


def _lines_read(
    path: str, lines: Iterable[bytes], fh: Any, batch_size: int, records: int | None, to_end: bool
) -> Iterator[RawBatch]:
    """``read_json_lines`` of the ``lines`` of an open file ``fh`` (``to_end``: read to its end for its
    hash once ``records`` are handed over)."""
    items: list[bytes] = []
    positions: list[int] = []
    empty = True
    left = records
    for line_no, line in enumerate(lines, start=1):
        if line_no == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8) :]  # Windows exports start with one
        if not line.strip():
            continue
        empty = False
        items.append(line)
        positions.append(line_no)
        if left is not None:
            left -= 1
            if not left:
                if to_end:
                    read_rest(fh)
                break
        if len(items) >= batch_size:
            yield RawBatch(path, 0, items, positions, raw_lines=True)
            items, positions = [], []
    if items:
        yield RawBatch(path, 0, items, positions, raw_lines=True)
    if empty:
        raise InputError(f"{path}: the file is empty; remove it from the inputs")


def _after(head: bytes, fh: Any) -> Iterator[bytes]:
    """The lines of a file whose first bytes ``head`` were read already, the rest still in ``fh``."""
    lines = head.splitlines(keepends=True)
    cut = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
    yield from lines
    joined = cut + fh.readline()
    if joined:
        yield joined
    yield from fh


def _read_marking(
    source: InputSource, batch_size: int, digests: dict[str, str] | None, ends: PartEnds
) -> Iterator[RawBatch]:
    """``read_json_lines`` that hashes the lines as it reads them, cutting the input into parts.

    A batch is handed over once the next record (or the end) is read, so that when the batch that ends
    a part arrives, that part's end is known.
    """
    path = source.display
    plain = source.compression is None
    whole = hashlib.blake2b(digest_size=16)
    offset = line_no = records = 0
    start = (0, 0)  # the offset and the records where the part being read starts
    items: list[bytes] = []
    positions: list[int] = []
    held: RawBatch | None = None
    raw_digests: dict[str, str] = {}  # a compressed file's own hash, taken under the decompression
    with open_input(source, None if plain else raw_digests) as fh:
        for line in fh:
            whole.update(line)
            offset += len(line)
            line_no += 1
            if line_no == 1 and line.startswith(codecs.BOM_UTF8):
                line = line[len(codecs.BOM_UTF8) :]  # Windows exports start with one
            if not line.strip():
                continue
            if held is not None:
                yield held
                held = None
            items.append(line)
            positions.append(line_no)
            records += 1
            if records - start[1] >= ends.every or offset - start[0] >= ends.size:
                ends.ends.append(whole.hexdigest())
                ends.records.append(records - start[1])
                start = (offset, records)
            if len(items) >= batch_size or start[1] == records:  # full, or the part's last
                held = RawBatch(path, 0, items, positions, raw_lines=True)
                items, positions = [], []
                ends.passed = (offset, records)
    ends.whole = whole.hexdigest()
    if records > start[1]:
        ends.ends.append(ends.whole)
        ends.records.append(records - start[1])
    ends.file = ends.whole if plain else raw_digests.get(str(Path(source.path)))
    if digests is not None and ends.file is not None:
        digests[str(Path(source.path))] = ends.file
    if held is not None:
        yield held
    if items:
        yield RawBatch(path, 0, items, positions, raw_lines=True)
    if not records:
        raise InputError(f"{path}: the file is empty; remove it from the inputs")


CHUNK = 1 << 20
# Read first (a file that is no array is read again as JSON lines), and at a time for the first records only.
HEAD_CHUNK = 1 << 16


class _TextStream:
    """A source's text, decoded from UTF-8 by chunks: a window ``buf`` that grows at its end on demand."""

    def __init__(self, fh: Any, name: str, chunk: int = CHUNK) -> None:
        self.fh = fh
        self.name = name
        self.chunk = chunk
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.eof = False
        self.bytes_read = 0
        self.first = True
        self.raw = b""  # the bytes read, while it is not known whether the file holds an array
        self.keeping = True
        self.bom = 0  # bytes of the byte order mark skipped at the start
        self.dropped_bytes = 0  # bytes of the text dropped from the start of ``buf``

    def more(self) -> bool:
        """Append the next chunk to ``buf``; return False at the end of the stream."""
        if self.eof:
            return False
        data = self.fh.read(min(HEAD_CHUNK, self.chunk) if self.first else self.chunk)
        if self.keeping:
            self.raw += data
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


def _skip_space(stream: _TextStream, pos: int) -> int:
    while True:
        while pos < len(stream.buf) and stream.buf[pos] in " \t\r\n":
            pos += 1
        if pos < len(stream.buf) or not stream.more():
            return pos


def read_json(source: InputSource, how: Reading) -> Iterator[RawBatch]:
    """Read a JSON array of records element by element, as a stream, or fall back to JSON lines.

    Elements are delimited by a scan of brackets and strings and decoded one at a time, so that memory
    holds one record (and a chunk), never the whole file, and a file cut off in the middle of a record
    (a broken download) still gives every complete record before the cut; the cut itself is reported
    as one bad record. ``how.head``: read by chunks of ``HEAD_CHUNK``.
    """
    path, batch_size, digests, records = source.display, how.batch_size, how.digests, how.records
    with open_input(source, digests) as fh:
        stream = _TextStream(fh, path, HEAD_CHUNK if how.head else CHUNK)
        pos = _skip_space(stream, 0)
        if pos >= len(stream.buf):
            raise InputError(f"{path}: the file is empty; remove it from the inputs")
        if stream.buf[pos] != "[":
            _refuse_object_over_lines(stream, pos, path)
            # A .json file holding JSON lines, as many exports do: read on, from the bytes read so far.
            lines = _after(stream.raw, fh)
            yield from _lines_read(path, lines, fh, batch_size, records, digests is not None)
            return
        stream.raw, stream.keeping = b"", False
        finish = (lambda: read_rest(fh)) if digests is not None else None
        yield from first_records(_read_json_array(stream, pos + 1, path, batch_size), records, finish)


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
            end = json_value_end(stream, pos)
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
                found = found_at(stream.buf[pos:end], exc.pos)  # within the element
                batch.errors.append(
                    (record_no, "invalid_json", f"invalid JSON ({exc.msg} at byte {where} of the file, {found})")
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
