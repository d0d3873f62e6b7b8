"""A shard's list columns read as numpy arrays straight from their Arrow buffers, without a copy.

pyarrow's own ways import more than a pack, ``stats`` or ``verify`` otherwise loads: ``ListArray.flatten``
and ``Array.is_null`` import ``pyarrow.compute`` (26 ms), and ``Array.to_numpy`` imports pandas (0.16 s).
``from_buffers`` reads a list column of numbers without nulls (every column packcli writes) from its
offsets and values buffers, and says None for any other column; ``list_parts`` reads any list column, from
its buffers where it can, else through pyarrow.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# The value types read from their buffers, and their numpy types (a bool is one bit: not among them).
_NUMPY_TYPES = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float16(): np.float16,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def from_buffers(column: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """Return (each row's length as int64, all rows' values flat) of a ``list<number>`` column without a
    null (neither a null row nor a null value), read from its buffers; None for any other column."""
    offsets = _offsets(column)
    dtype = _NUMPY_TYPES.get(column.values.type) if offsets is not None else None
    if offsets is None or dtype is None:
        return None
    values = column.values
    start, end = int(offsets[0]), int(offsets[-1])
    if values.null_count and values.slice(start, end - start).null_count:
        return None
    values_buffer = values.buffers()[1]
    if values_buffer is None:  # no values at all (every row empty)
        flat = np.zeros(0, dtype=dtype)
    else:
        flat = np.frombuffer(values_buffer, dtype=dtype, count=values.offset + end)[values.offset + start :]
    return np.diff(offsets.astype(np.int64)), flat


def list_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Return (per-row lengths, flat values) of a list column, as numpy arrays: from its buffers where it is a
    list of numbers without a null, else through pyarrow."""
    read = from_buffers(column)
    if read is not None:
        return read
    offsets = column.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    values = column.flatten().to_numpy(zero_copy_only=False)
    return np.diff(offsets), values


def values_hold_null(column: pa.Array) -> bool:
    """Whether the values of a list column's rows hold a null (``column.flatten().null_count``)."""
    offsets = _offsets(column)
    if offsets is None:
        return column.flatten().null_count > 0
    start, end = int(offsets[0]), int(offsets[-1])
    return column.values.slice(start, end - start).null_count > 0


def _offsets(column: pa.Array) -> np.ndarray | None:
    """The offsets of a non-empty ``list`` column without a null row, read from its buffer (its rows'
    ends in its values, the first row's start first); None for any other column."""
    if not pa.types.is_list(column.type) or column.null_count or not len(column):
        return None
    buffer = column.buffers()[1]
    if buffer is None:
        return None
    return np.frombuffer(buffer, dtype=np.int32, count=column.offset + len(column) + 1)[column.offset :]
