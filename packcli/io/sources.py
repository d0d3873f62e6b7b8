"""Find the inputs: paths, globs, directories, saved datasets and Hub names, as a sorted list of sources.

Each input's content hash (remembered by size, mtime, inode and ctime), which keys the cache, and the
check that an input did not change while it was read are ``packcli.io.fingerprint``; reading the
sources is ``packcli.io.readers``.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packcli.errors import InputError, UsageError
from packcli.io.footer import parquet_footer
from packcli.io.uri import is_uri
from packcli.procs import cleanup
from packcli.procs.stop import interruptible

FILE_TYPES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}
# Compressed text inputs: data.jsonl.gz, data.csv.zst, ... (read as a stream, never unpacked whole).
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
COMPRESSIBLE = ("jsonl", "json", "csv")
SUPPORTED = (
    ", ".join(sorted(FILE_TYPES))
    + " (JSON, JSON lines and CSV also as "
    + ", ".join(sorted(set(COMPRESSIONS) - {".zstd"}))
    + ")"
)
STDIN = "-"


@dataclass(frozen=True)
class InputSource:
    """One input: a file, a dataset saved with ``save_to_disk``, or a Hub dataset name."""

    path: str
    kind: str  # jsonl | json | parquet | csv | arrow | saved_dataset | hub
    split: str | None = None
    compression: str | None = None  # gzip | zstd | bz2 | xz, for text kinds
    # What the user named, when ``path`` is not it: "-" (stdin) or a FIFO, spooled to ``path``.
    label: str | None = None
    # Its records, when the run knows them without reading it again (counted as it was hashed, or
    # remembered with its hash: ``io.fingerprint``); for progress only.
    records: int | None = field(default=None, compare=False)

    @property
    def display(self) -> str:
        if self.label is not None:
            return self.label
        return self.path if self.kind != "hub" else f"hub:{self.path}[{self.split}]"


@dataclass
class RawBatch:
    """Consecutive records of one source.

    ``items`` holds raw JSON lines (bytes) for JSON lines files and dicts otherwise; ``positions``
    holds each record's 1-based line (JSON lines) or record number in its file, for error messages.
    """

    source: str
    first_index: int
    items: list[Any]
    positions: list[int]
    raw_lines: bool = False
    errors: list[tuple[int, str, str]] = field(default_factory=list)  # (position, reason, detail)
    # The hash of its records, where the reader made it from what it decoded them from (an Arrow batch's
    # serialized form, of ``hashed_bytes``): cheaper than pickling the records (``io.readers.read_parts``).
    digest: bytes | None = None
    hashed_bytes: int = 0

    def cut(self, keep: int) -> None:
        """Keep the first ``keep`` records only (and their errors)."""
        self.items, self.positions = self.items[:keep], self.positions[:keep]
        kept = set(self.positions)
        self.errors = [e for e in self.errors if e[0] in kept]
        self.digest = None


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def resolve_inputs(paths: list[str], split: str | None = None, skipped: list[str] | None = None) -> list[InputSource]:
    """Expand paths, globs and directories into a sorted list of sources; raise on anything unusable.

    packcli's own outputs and staging directories found by a directory walk or a glob are never
    inputs; they are left out and appended to ``skipped``.
    """
    sources: list[InputSource] = []
    skipped = [] if skipped is None else skipped
    for raw in paths:
        if not raw.strip():
            raise UsageError("an input path is empty (an unset shell variable?); pass files, directories or globs")
        path = Path(raw)
        if is_uri(raw):
            sources.extend(_uri_sources(raw))
        elif raw == STDIN or _is_stream(path):
            sources.append(_stream_source(raw))
        elif glob.has_magic(raw):
            matches = sorted(glob.glob(raw, recursive=True))
            matched = [Path(m) for m in matches if Path(m).is_file()]
            files = _not_packcli(matched, skipped)
            if matched and not files:
                raise InputError(
                    f"{raw}: the pattern matches only files in packcli outputs, which are never inputs; "
                    "check the pattern"
                )
            if not files:
                raise InputError(f"{raw}: the pattern matches no file; check the pattern")
            sources.extend(_file_source(f) for f in files)
        elif _is_saved_dataset(path):
            sources.append(InputSource(str(path), "saved_dataset"))
        elif path.is_dir():
            _refuse_packcli_dir(path, raw)
            files = sorted(p for p in _files_below(path, skipped) if _kind_of(p)[0] is not None)
            if not files:
                raise InputError(f"{raw}: the directory holds no {SUPPORTED} file")
            sources.extend(_file_source(f) for f in files)
        elif path.is_file():
            sources.append(_file_source(path))
        elif _looks_like_hub_name(raw):
            sources.append(InputSource(raw, "hub", split or "train"))
        else:
            raise InputError(f"{raw}: no such file or directory; check the path")
    if not sources:
        raise UsageError("no input given; pass one or more files, directories or globs")
    # Sorted, with duplicates removed, so that sample_index does not depend on the argument order.
    # A file named twice (d, d/m.jsonl, $PWD/d/m.jsonl, d/../d/m.jsonl, a symlink or a hard link to it)
    # is one input: duplicates are found by device and inode, and the shortest spelling is kept,
    # whichever came first.
    by_target: dict[tuple[Any, ...], InputSource] = {}
    for s in sorted(sources, key=lambda s: (len(s.path), s.path)):
        by_target.setdefault(input_identity(s), s)
    unique = {(s.kind != "hub", s.path): s for s in by_target.values()}
    for s in unique.values():
        _refuse_shard(s)
    return [unique[k] for k in sorted(unique)]


# The columns by which a file is known as a packcli shard, whatever its name or place: every output
# layout packcli writes as Parquet or Arrow (its own, and Megatron's) has them (see contract.py).
SHARD_COLUMNS = ("input_ids", "seq_lengths", "sample_index")


def _refuse_shard(source: InputSource) -> None:
    """Raise InputError when a local Parquet or Arrow input is a shard packcli wrote, known by its columns.

    Read as tokenized records, each packed row would be one sample: the samples in it would attend to
    each other and their boundaries would be lost. Only the schema is read (a Parquet footer, an Arrow
    file's first message).
    """
    if source.kind not in ("parquet", "arrow") or is_uri(source.path):
        return
    names = _schema_names(source.path, source.kind)
    if not all(c in names for c in SHARD_COLUMNS):
        return
    from packcli.owned import read_own_manifest

    manifest = read_own_manifest(Path(source.path).resolve().parent)
    named = [i.get("path") for i in manifest.get("inputs", []) if isinstance(i, dict)] if manifest else []
    if named:
        listed = ", ".join(map(str, named[:3])) + (", ..." if len(named) > 3 else "")
        where = f": {listed}, as the manifest.json beside it says"
    else:
        where = " (the manifest.json of the output they were packed into names them)"
    raise InputError(
        f"{source.display}: is a packed shard written by packcli (columns {', '.join(SHARD_COLUMNS)}), which is "
        f"never read as input: its rows hold several samples whose boundaries would be lost; pack the original "
        f"records again{where}"
    )


def _schema_names(path: str, kind: str) -> list[str]:
    """The column names of a Parquet or Arrow file; none when it cannot be read (the reader says why).

    Every run asks, a cache hit too: a Parquet file's footer alone is read (its last 8 bytes, then the
    footer they give the length of), an Arrow file's schema message."""
    import pyarrow as pa

    try:
        with open(path, "rb", buffering=0) as fh:
            if kind == "parquet":
                footer = parquet_footer(fh)
                return list(footer.schema.to_arrow_schema().names) if footer is not None else []
            try:
                return list(pa.ipc.open_file(fh).schema.names)
            except pa.ArrowInvalid:
                fh.seek(0)
                return list(pa.ipc.open_stream(fh).schema.names)
    except (OSError, pa.ArrowException):
        return []


def input_identity(source: InputSource) -> tuple[Any, ...]:
    """What makes two sources one input: the same file (device and inode), URI or Hub dataset."""
    if source.kind == "hub" or is_uri(source.path):
        return (source.kind, source.path, source.split)
    try:
        st = os.stat(source.path)
    except OSError:  # reported by the reader, in its turn
        return ("path", str(Path(source.path).resolve()))
    return ("file", st.st_dev, st.st_ino)


# What an input at a URI may be: the kinds read as streams or by range (not Arrow files or saved
# datasets, which are memory-mapped).
URI_KINDS = ("jsonl", "json", "parquet", "csv")


def _uri_sources(raw: str) -> list[InputSource]:
    """The files of an input URI: the file itself, or every file of a supported type under the prefix."""
    from pyarrow import fs as pafs

    try:
        filesystem, where = pafs.FileSystem.from_uri(raw)
        info = filesystem.get_file_info(where)
        if info.type == pafs.FileType.Directory:
            infos = filesystem.get_file_info(pafs.FileSelector(where, recursive=True))
            found = sorted(i.path for i in infos if i.type == pafs.FileType.File)
        elif info.type == pafs.FileType.File:
            found = [where]
        else:
            raise InputError(f"{raw}: no such file or prefix; check the URI")
    except (OSError, ValueError) as exc:
        raise InputError(f"{raw}: cannot list the input ({exc}); check the URI and credentials") from exc
    scheme = raw.partition("://")[0]
    sources = []
    for found_path in found:
        uri = f"{scheme}://{found_path}" if scheme != "file" else Path(found_path).as_uri()
        kind, compression = _kind_of(Path(found_path))
        if kind is None or kind not in URI_KINDS:
            if info.type == pafs.FileType.File:
                raise InputError(
                    f"{raw}: an input at a URI must be JSON lines, JSON, Parquet or CSV (optionally compressed); "
                    "copy other files to a local path"
                )
            continue
        sources.append(InputSource(uri, kind, compression=compression))
    if not sources:
        raise InputError(f"{raw}: the prefix holds no JSON lines, JSON, Parquet or CSV file")
    return sources


def missing_input(raw: str) -> bool:
    """Return whether an input argument names nothing: no path, no glob, and not a Hub dataset name."""
    return not (raw == STDIN or is_uri(raw) or Path(raw).exists() or glob.has_magic(raw) or _looks_like_hub_name(raw))


def _refuse_packcli_dir(path: Path, raw: str) -> None:
    from packcli.owned import is_packcli_dir

    if is_packcli_dir(path):
        raise InputError(
            f"{raw}: is a packcli output or staging directory, which packcli never reads as input; "
            "pass the original data"
        )


def _files_below(root: Path, skipped: list[str]) -> list[Path]:
    """Every file below ``root``, leaving out packcli's outputs, staging directories and caches."""
    from packcli.owned import is_cache_dir, is_packcli_dir

    files: list[Path] = []
    for directory, dirnames, filenames in os.walk(root):
        here = Path(directory)
        for name in sorted(dirnames):
            if is_packcli_dir(here / name) or is_cache_dir(here / name):
                skipped.append(str(here / name))
                dirnames.remove(name)
        files.extend(p for p in (here / f for f in filenames) if p.is_file())
    return files


def _not_packcli(files: list[Path], skipped: list[str]) -> list[Path]:
    """The files not inside one of packcli's outputs or staging directories."""
    from packcli.owned import is_packcli_dir

    verdict: dict[Path, bool] = {}

    def own(directory: Path) -> bool:
        if directory not in verdict:
            verdict[directory] = is_packcli_dir(directory)
            if verdict[directory]:
                skipped.append(str(directory))
        return verdict[directory]

    return [f for f in files if not any(own(d) for d in f.parents if d != Path("."))]


def _looks_like_hub_name(raw: str) -> bool:
    # "owner/name": one slash, no file extension, not a relative or absolute path.
    return (
        raw.count("/") == 1
        and not raw.startswith((".", "/", "~"))
        and Path(raw).suffix.lower() not in FILE_TYPES
        and Path(raw).suffix.lower() not in COMPRESSIONS
        and not Path(raw).parent.exists()
    )


def _kind_of(path: Path) -> tuple[str | None, str | None]:
    """Return (kind, compression) of a file by its name: data.jsonl -> (jsonl, None), x.csv.gz -> (csv, gzip)."""
    suffix = path.suffix.lower()
    compression = COMPRESSIONS.get(suffix)
    if compression is None:
        return FILE_TYPES.get(suffix), None
    kind = FILE_TYPES.get(Path(path.stem).suffix.lower())
    return (kind, compression) if kind in COMPRESSIBLE else (None, compression)


def _file_source(path: Path, label: str | None = None) -> InputSource:
    kind, compression = _kind_of(path)
    name = Path(label) if label is not None else path
    if kind is None and compression is not None:
        inner = Path(name.stem).suffix or "(none)"
        raise InputError(
            f"{name}: a compressed file of type '{inner}'; only JSON, JSON lines and CSV are read compressed "
            "(Parquet and Arrow compress inside): decompress it, or name it .jsonl.gz, .json.gz or .csv.gz"
        )
    if kind is None:
        raise InputError(f"{name}: unsupported file type '{name.suffix}'; use one of {SUPPORTED}")
    return InputSource(str(path), kind, compression=compression, label=label)


def _is_stream(path: Path) -> bool:
    """Return whether ``path`` is a named pipe (FIFO) or a shell's process substitution (/dev/fd/N)."""
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False


# Streams read this run, by what the user named: a stream can be read once only, and the run reads
# its inputs more than once (format detection, the content hash, the records), so it is copied to a
# file first (on disk, by chunks; never held in memory).
_SPOOLED: dict[str, InputSource] = {}


def forget_streams() -> None:
    """Start a new run: the streams it names are read anew (the copies of an earlier run are removed,
    and those that killed runs left in the temporary directory)."""
    from packcli.owned import clean_stale_stream_copies

    for source in _SPOOLED.values():
        _remove(source.path)
    _SPOOLED.clear()
    clean_stale_stream_copies(Path(tempfile.gettempdir()))


def _stream_source(raw: str) -> InputSource:
    """Copy standard input ("-", JSON lines) or a FIFO (typed by its name) to a file; return it as a source."""
    if raw in _SPOOLED and Path(_SPOOLED[raw].path).exists():
        return _SPOOLED[raw]
    if raw == STDIN:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError(
                "-: standard input is a terminal; pipe JSON lines into it (zcat data.jsonl.gz | packcli ...)"
            )
        suffix, label = ".jsonl", "stdin"
    else:
        suffix, label = "".join(Path(raw).suffixes[-2:]), raw
        if not suffix:
            suffix = ".jsonl"  # a pipe without a type in its name (/dev/fd/63 of <(...)): JSON lines, as stdin
        elif _kind_of(Path("x" + suffix))[0] is None:
            _file_source(Path(raw))  # the error for this file type, naming it
    from packcli.owned import STREAM_COPY_PREFIX, owner_tag

    # The owner's host and PID in the name: a later run removes the copy once that process is gone.
    fd, spool = tempfile.mkstemp(prefix=f"{STREAM_COPY_PREFIX}{owner_tag()}-", suffix=suffix)
    atexit.register(_remove, spool)
    cleanup.temporary(Path(spool))
    try:
        # Opening a FIFO waits for a writer, and reading a stream for its data, for ever if none comes:
        # the first SIGINT or SIGTERM stops them at once.
        with os.fdopen(fd, "wb") as out, interruptible():
            if raw == STDIN:
                shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
            else:
                with open(raw, "rb") as stream:
                    shutil.copyfileobj(stream, out, 1 << 20)
    except OSError as exc:
        _remove(spool)
        raise InputError(
            f"{label}: cannot copy the stream to {spool} ({exc.strerror or exc}); free disk space there or set TMPDIR"
        ) from exc
    except BaseException:
        _remove(spool)
        raise
    source = _file_source(Path(spool), label)
    _SPOOLED[raw] = source
    return source


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
    cleanup.kept(Path(path))
