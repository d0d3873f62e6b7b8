"""A Parquet file's footer (its schema, row groups and row count), read alone: the 8 bytes at its end, then
the footer they give the length of. pyarrow reads the last 64 KiB first, whatever the footer's size."""

from __future__ import annotations

import io
import os
from typing import Any


def parquet_footer(fh: Any) -> Any:
    """The ``pyarrow.parquet.FileMetaData`` of the Parquet file open as ``fh`` (seekable, binary), or None
    when it is not a Parquet file with a plain footer (the reader then says what it is)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = fh.seek(0, os.SEEK_END)
    if size < 12:
        return None
    fh.seek(size - 8)
    tail = _read(fh, 8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length > size - 12:
        return None  # not Parquet, or its footer encrypted
    fh.seek(size - 8 - length)
    footer = _read(fh, length)
    try:  # the footer alone, between the magic bytes, reads as a file whose row groups are not read
        return pq.read_metadata(io.BytesIO(b"PAR1" + footer + tail))
    except (OSError, pa.ArrowException):
        return None


def _read(fh: Any, n: int) -> bytes:
    pieces = []
    while n > 0 and (piece := fh.read(n)):  # a raw read may give less than asked
        pieces.append(piece)
        n -= len(piece)
    return b"".join(pieces)
