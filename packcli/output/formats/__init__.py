"""Shard file formats: one writer and one reader per format, found by name or by file extension.

Everything that writes or reads shard files goes through this registry (``output.rows.write_shard``,
the read side in ``report``, the training checks, the Ray engine). Each format is one module here,
one ``ShardFormat`` subclass (``base.py``): ``parquet`` (the default), ``arrow`` (Arrow IPC stream),
``mds`` (MosaicML streaming's MDS) and ``megatron`` (the packed Parquet layout Megatron-Bridge's
packed SFT dataset reads). Every format reads back as the packcli columns, so ``stats``, ``inspect``
and ``verify`` work on all of them.

To add a format: write one module beside these with a ``ShardFormat`` subclass (its ``name``,
``extension``, ``writer``, ``batches`` and ``schema``; ``index_files``, ``write_index`` and
``_index_problems`` when a trainer's reader opens a file beside the shards; ``datasets_reader`` when
``datasets`` opens the files as they are) and add an instance of it to ``_BUILT_IN`` below. Two
lower layers name formats too and cannot import this registry: add the name to ``output_format``'s
choices in ``config.py`` and any index file to ``owned.INDEX_FILES``; tests check that both agree
with the registry.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from packcli.output.formats.arrow import ArrowStreamFormat
from packcli.output.formats.base import (
    MAX_INDEX_PROBLEMS,
    MISSING_INDEX,
    READ_BATCH_ROWS,
    ShardFormat,
    ShardWriter,
)
from packcli.output.formats.mds import MDS_INDEX, MDSFormat
from packcli.output.formats.megatron import MEGATRON_METADATA, MegatronFormat
from packcli.output.formats.parquet import ParquetFormat

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "FORMATS",
    "MAX_INDEX_PROBLEMS",
    "MDS_INDEX",
    "MEGATRON_METADATA",
    "MISSING_INDEX",
    "READ_BATCH_ROWS",
    "ArrowStreamFormat",
    "MDSFormat",
    "MegatronFormat",
    "ParquetFormat",
    "ShardFormat",
    "ShardWriter",
    "format_of",
    "read_shard",
    "register",
    "shard_batches",
    "shard_format",
    "shard_schema",
]

FORMATS: dict[str, ShardFormat] = {}
# Longest first: a Megatron shard ends in .idx.parquet, which also ends in .parquet.
_BY_EXTENSION: dict[str, ShardFormat] = {}


def register(fmt: ShardFormat) -> ShardFormat:
    """Add ``fmt`` to the registry under its name and extension (replacing a format of that name); return it."""
    FORMATS[fmt.name] = fmt
    kept = {extension: f for extension, f in _BY_EXTENSION.items() if f.name != fmt.name}
    by_extension = sorted({**kept, fmt.extension: fmt}.items(), key=lambda item: -len(item[0]))
    _BY_EXTENSION.clear()
    _BY_EXTENSION.update(by_extension)
    return fmt


_BUILT_IN = (ParquetFormat(), ArrowStreamFormat(), MDSFormat(), MegatronFormat())
for built_in in _BUILT_IN:
    register(built_in)


def shard_format(name: str) -> ShardFormat:
    """Return the format registered as ``name`` (``parquet``, ``arrow``, ``mds``, ``megatron``)."""
    return FORMATS[name]


def format_of(path: Path) -> ShardFormat:
    """Return the format of a shard file, from its extension."""
    for extension, fmt in _BY_EXTENSION.items():
        if path.name.endswith(extension):
            return fmt
    raise ValueError(f"{path.name}: not a shard file (known: {', '.join(_BY_EXTENSION)})")


def shard_batches(
    path: Path, columns: Sequence[str] | None = None, batch_rows: int = READ_BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """Yield the rows of one shard as record batches of at most ``batch_rows``.

    Raises OSError or pyarrow.ArrowException for a file that cannot be read.
    """
    yield from format_of(path).batches(path, columns, batch_rows)


def read_shard(path: Path) -> pa.Table:
    """Read one shard as a table."""
    return format_of(path).read(path)


def shard_schema(path: Path) -> pa.Schema:
    """Return one shard's schema."""
    return format_of(path).schema(path)
