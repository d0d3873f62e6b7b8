"""A local file read by a reader that seeks (Parquet and Arrow files: their footer first), hashed in file order
as it is read: the file's hash (``io.fingerprint``'s) from the one read that tokenizes it.

The reader asks for byte ranges in any order. A range at the point the hash has reached is hashed as it
is read; a range beyond it is kept (up to ``KEEP`` bytes in all) until the hash reaches it, so that it is
not read again; a small gap before a range asked for (a file's magic, an index the reader skips) is read
and hashed then, and kept until the reader asks for it. ``finish`` reads what the reader never asked for
and returns the hash. ``read_bytes`` counts every byte taken from the file: a range asked for again after
the hash passed it (which Parquet's and Arrow's readers do not do) is read again, and counted.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

from packcli.procs.stop import raise_if_stopped

# Bytes read ahead of the hash kept in memory at most (a Parquet footer, Arrow's); beyond it a range is
# read again when the hash comes to it.
KEEP = 1 << 26
# A gap before a range asked for that is read (and hashed) at once rather than kept for later.
GAP = 1 << 20
CHUNK = 1 << 22


class InOrderFile(io.RawIOBase):
    """A local file opened for a reader that seeks, hashed in file order (``hashing``) as it is read."""

    def __init__(self, path: str, hashing: bool = True) -> None:
        super().__init__()
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by close)
        self._size = os.fstat(self._file.fileno()).st_size
        self._pos = 0
        self.hash = hashlib.blake2b(digest_size=16) if hashing else None
        self._hashed = 0  # the hash covers the bytes before this offset
        self._ahead: dict[int, bytes] = {}  # ranges read for the reader ahead of the hash, by offset
        self._filled: dict[int, bytes] = {}  # gaps hashed before the reader asked for them, by offset
        self.read_bytes = 0

    # -- the file object pyarrow reads -------------------------------------------------------------------

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._size - self._pos))
        if not n:
            return 0
        data = self._range(self._pos, n)
        memoryview(buffer)[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self._ahead.clear()
            self._filled.clear()
        super().close()

    # -- hashing in file order ---------------------------------------------------------------------------

    def finish(self) -> str:
        """Hash the bytes the reader never asked for, to the file's end; return the file's hash."""
        assert self.hash is not None
        while self._hashed < self._size:
            raise_if_stopped()
            self._advance(min(self._size, self._hashed + CHUNK))
        self._ahead.clear()
        self._filled.clear()
        return self.hash.hexdigest()

    def _range(self, pos: int, n: int) -> bytes:
        end = pos + n
        if self.hash is None:
            return self._disk(pos, n)
        if pos > self._hashed:
            if pos - self._hashed > GAP:  # far ahead (a footer): kept until the hash comes to it
                data = self._covered(self._ahead, pos, end)
                if _total(self._ahead) + len(data) <= KEEP:
                    self._ahead[pos] = data
                return data
            gap_at = self._hashed
            gap = self._advance(pos)  # a small gap: hashed now, kept until the reader asks for it
            if gap and _total(self._filled) + len(gap) <= KEEP:
                self._filled[gap_at] = gap
            data = self._advance(end)
            if _total(self._filled) + len(data) <= KEEP:  # asked for ahead (a footer): it may be asked again
                self._filled[pos] = data
            return data
        behind = b""
        if pos < self._hashed:  # hashed already: a gap filled before, else read again
            upto = min(end, self._hashed)
            behind = self._covered(self._filled, pos, upto)
            self._forget(pos, upto)
        return behind + (self._advance(end) if end > self._hashed else b"")

    def _forget(self, pos: int, end: int) -> None:
        """Let go of ``[pos, end)`` of the gaps kept (the reader has it now); keep the rest of each."""
        for start in [s for s, b in self._filled.items() if s < end and s + len(b) > pos]:
            block = self._filled.pop(start)
            if start < pos:
                self._filled[start] = block[: pos - start]
            if start + len(block) > end:
                self._filled[end] = block[end - start :]

    def _advance(self, end: int) -> bytes:
        """Hash the bytes from where the hash is to ``end`` (ranges kept ahead used, the rest read)."""
        assert self.hash is not None
        data = self._covered(self._ahead, self._hashed, end)
        self.hash.update(data)
        self._hashed = end
        for start in [s for s, b in self._ahead.items() if s + len(b) <= end]:
            del self._ahead[start]
        return data

    def _covered(self, blocks: dict[int, bytes], pos: int, end: int) -> bytes:
        """The bytes ``[pos, end)``: from ``blocks`` (kept ranges, by offset) where they hold them, else read."""
        pieces = []
        at = pos
        for start in sorted(blocks):
            block = blocks[start]
            stop = start + len(block)
            if stop <= at or start >= end:
                continue
            if start > at:
                pieces.append(self._disk(at, start - at))
                at = start
            take = min(stop, end)
            pieces.append(block[at - start : take - start])
            at = take
            if at >= end:
                break
        if at < end:
            pieces.append(self._disk(at, end - at))
        return b"".join(pieces)

    def _disk(self, pos: int, n: int) -> bytes:
        if not n:
            return b""
        self._file.seek(pos)
        pieces = []
        while n > 0 and (piece := self._file.read(n)):  # a raw read may give less than asked
            pieces.append(piece)
            n -= len(piece)
        data = b"".join(pieces)
        self.read_bytes += len(data)
        return data


def _total(blocks: dict[int, bytes]) -> int:
    return sum(len(b) for b in blocks.values())
