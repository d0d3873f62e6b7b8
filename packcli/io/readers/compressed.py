"""The decompressed bytes of an input: gzip, bz2, xz and zstd read as a stream, and opening a file source.

Every reader opens its file through ``open_input``, so each kind is read compressed or not alike.
"""

from __future__ import annotations

import bz2
import contextlib
import functools
import hashlib
import io
import lzma
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from packcli.errors import InputError, first_line
from packcli.io.sources import InputSource
from packcli.io.uri import is_uri, open_uri
from packcli.procs.stop import raise_if_stopped

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
        except _decode_errors() as exc:
            if self._members > 1 and not self._fed:
                raise self._error(
                    f"after {_MEMBER[self._compression]} {self._members - 1} the file holds bytes that are not "
                    f"{self._compression} data; it is damaged, or other data was appended to it"
                ) from exc
            raise self._error(f"the {self._compression} data is damaged ({first_line(exc, limit=None)})") from exc
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


@functools.cache
def _decode_errors() -> tuple[type[BaseException], ...]:
    """What decoding damaged data raises: asked when decoding fails, so that this module imports no zstandard."""
    errors: list[type[BaseException]] = [OSError, EOFError, lzma.LZMAError, zlib.error]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


# Decompressed bytes buffered for the readers.
BUFFER = 1 << 20


def _decompressed(raw: Any, compression: str, name: str) -> Any:
    return io.BufferedReader(Decompressed(raw, compression, name), BUFFER)


class _Hashing(io.RawIOBase):
    """A file read once from its start to its end, hashed as it is read (BLAKE2b, 16 bytes, as
    ``io.fingerprint`` hashes a file): the hash of the bytes the run used, without a second read."""

    def __init__(self, raw: Any, at_end: Callable[[str], None]) -> None:
        self._raw = raw
        self.hash = hashlib.blake2b(digest_size=16)
        self._at_end: Callable[[str], None] | None = at_end  # given the hash once the end is read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer) or 0
        if n:
            self.hash.update(memoryview(buffer)[:n])
        elif self._at_end is not None:
            self._at_end(self.hash.hexdigest())
            self._at_end = None
        return n

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def read_rest(fh: Any) -> None:
    """Read an open input to its end, for its hash (``open_input``'s ``digests``) alone."""
    while fh.read(BUFFER):
        raise_if_stopped()


@contextlib.contextmanager
def open_input(source: InputSource, digests: dict[str, str] | None = None) -> Iterator[Any]:
    """Open a file source for reading bytes, decompressing it as a stream when it is compressed.

    With ``digests``, a local file read through to its end leaves the hash of its bytes (as
    ``io.fingerprint.file_blake2b`` computes it) there, by its path, once its end is read: the reader
    must read it from its start to its end without seeking.
    """
    raw = open_uri(source.path) if is_uri(source.path) else open(source.path, "rb")  # noqa: SIM115
    if digests is not None and not is_uri(source.path):
        path = str(Path(source.path))
        raw = io.BufferedReader(_Hashing(raw, lambda digest: digests.__setitem__(path, digest)), BUFFER)
    fh = _decompressed(raw, source.compression, source.display) if source.compression else raw
    try:
        yield fh
    finally:
        fh.close()
        raw.close()
