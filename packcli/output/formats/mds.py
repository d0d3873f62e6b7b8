"""MosaicML streaming's MDS: shard files plus the index.json that ``StreamingDataset`` opens.

An MDS dataset is a directory of shard files and an index.json that lists them. A shard file is:
uint32 sample count n; uint32 offsets[n + 1] (byte offsets of each sample from the file start, the
last one its end); the shard's config as sorted JSON; then the samples. A sample is one uint32 size
per variable-size column, then each column's bytes, columns in sorted name order. An
"ndarray:<dtype>" column of a 1-D array is one byte (ndim << 2 | shape dtype code, the code 0, 1, 2
for a uint8, uint16, uint32 shape), the shape as that dtype, then the values. All little-endian.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packcli.errors import Opt, ShardTooLarge
from packcli.jsontypes import JSONObject
from packcli.output.formats.base import (
    MALFORMED,
    MAX_INDEX_PROBLEMS,
    ShardFormat,
    ShardWriter,
    compare_index,
    damaged,
    index_value,
    read_index,
)

if TYPE_CHECKING:
    import pyarrow as pa

MDS_INDEX = "index.json"
_MDS_SHAPE_DTYPES = (np.uint8, np.uint16, np.uint32, np.uint64)
_UINT32_MAX = (1 << 32) - 1


def _mds_config(schema: pa.Schema) -> JSONObject:
    import pyarrow as pa

    dtypes = {pa.int8(): "int8", pa.int32(): "int32", pa.int64(): "int64", pa.float32(): "float32"}
    names = sorted(schema.names)
    encodings = []
    for name in names:
        kind = schema.field(name).type
        if not pa.types.is_list(kind) or kind.value_type not in dtypes:
            raise ValueError(f"column {name} of type {kind} has no MDS encoding here")
        encodings.append(f"ndarray:{dtypes[kind.value_type]}")
    return {
        "column_encodings": encodings,
        "column_names": names,
        "column_sizes": [None] * len(names),
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": None,
        "version": 2,
    }


def _mds_array(values: np.ndarray) -> bytes:
    n = len(values)
    code = 0 if n < 1 << 8 else 1 if n < 1 << 16 else 2
    head = bytes([(1 << 2) | code]) + np.array([n], dtype=_MDS_SHAPE_DTYPES[code]).tobytes()
    return head + values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes()


class _MDSWriter:
    """Writes one MDS shard: samples go to a side file as they come, the header goes first at close."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._path = path
        self._config = _mds_config(schema)
        self._body_path = path.with_name(path.name + ".body")
        self._body = open(self._body_path, "wb")  # noqa: SIM115  (closed in close())
        self._sizes: list[int] = []
        self._body_bytes = 0

    def write(self, table: pa.Table) -> None:
        names = self._config["column_names"]
        columns = []
        for name in names:
            col = table.column(name).combine_chunks()
            offsets = col.offsets.to_numpy()
            columns.append((offsets - offsets[0], col.flatten().to_numpy(zero_copy_only=False)))
        for r in range(table.num_rows):
            parts = [_mds_array(values[offsets[r] : offsets[r + 1]]) for offsets, values in columns]
            sample = np.array([len(part) for part in parts], dtype="<u4").tobytes() + b"".join(parts)
            self._body.write(sample)
            self._sizes.append(len(sample))
            self._body_bytes += len(sample)

    def close(self) -> None:
        self._body.close()
        try:
            config = json.dumps(self._config, sort_keys=True).encode()
            header = 4 + 4 * (len(self._sizes) + 1) + len(config)
            offsets = header + np.concatenate([[0], np.cumsum(self._sizes, dtype=np.int64)])
            if offsets[-1] > _UINT32_MAX:
                raise ShardTooLarge(
                    f"{self._path.name} would be {offsets[-1]:,} bytes; an MDS shard holds at most 4 GiB "
                    "(its offsets are 32-bit): lower ",
                    Opt("rows_per_shard"),
                )
            with open(self._path, "wb") as out, open(self._body_path, "rb") as body:
                out.write(np.array([len(self._sizes)], dtype="<u4").tobytes())
                out.write(offsets.astype("<u4").tobytes())
                out.write(config)
                while chunk := body.read(1 << 22):
                    out.write(chunk)
        finally:
            self._body_path.unlink(missing_ok=True)


def _read_mds(path: Path) -> tuple[JSONObject, np.ndarray, Any]:
    """Return an MDS shard's config, sample offsets and bytes (memory-mapped: read as they are used)."""
    try:
        with open(path, "rb") as fh:
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError as exc:  # an empty file cannot be mapped
        raise damaged("MDS", path, exc) from exc
    try:
        n = int(np.frombuffer(data, "<u4", 1)[0])
        offsets = np.frombuffer(data, "<u4", n + 1, 4).astype(np.int64)
        config = json.loads(data[4 + 4 * (n + 1) : offsets[0]])
        if not isinstance(config, dict) or offsets[-1] != len(data) or (np.diff(offsets) < 0).any():
            raise ValueError("its header does not match its size")
        _mds_schema(config)
    except MALFORMED as exc:
        raise damaged("MDS", path, exc) from exc
    return config, offsets, data


class MDSFormat(ShardFormat):
    """MosaicML streaming's MDS: shard files plus the index.json that ``StreamingDataset`` opens.

    Every packcli column is an ``ndarray:<dtype>`` column of the same name (int32 token columns,
    int64 sample_index, float32 loss_weights), uncompressed.
    """

    name = "mds"
    extension = ".mds"
    index_files = (MDS_INDEX,)

    def writer(self, path: Path, schema: pa.Schema) -> ShardWriter:
        return _MDSWriter(path, schema)

    def schema(self, path: Path) -> pa.Schema:
        config, _, _ = _read_mds(path)
        return _mds_schema(config)

    def batches(self, path: Path, columns: Sequence[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        config, offsets, data = _read_mds(path)
        try:
            yield from self._batches(config, offsets, data, columns, batch_rows)
        except MALFORMED as exc:
            raise damaged("MDS", path, exc) from exc

    def _batches(
        self, config: JSONObject, offsets: np.ndarray, data: Any, columns: Sequence[str] | None, batch_rows: int
    ) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        schema = _mds_schema(config)
        wanted = list(columns) if columns else schema.names
        names = config["column_names"]
        dtypes = [np.dtype(e.split(":")[1]).newbyteorder("<") for e in config["column_encodings"]]
        n = len(offsets) - 1
        for start in range(0, n, batch_rows):
            values: dict[str, list[np.ndarray]] = {name: [] for name in names}
            for r in range(start, min(n, start + batch_rows)):
                at = int(offsets[r])
                sizes = np.frombuffer(data, "<u4", len(names), at)
                at += 4 * len(names)
                for name, dtype, size in zip(names, dtypes, sizes.tolist(), strict=True):
                    values[name].append(_mds_values(data, at, size, dtype))
                    at += size
            arrays = []
            for name in wanted:
                parts = values[name]
                lengths = np.array([len(v) for v in parts], dtype=np.int64)
                offs = np.zeros(len(parts) + 1, dtype=np.int32)
                np.cumsum(lengths, out=offs[1:])
                flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
                kind = schema.field(name).type
                arrays.append(pa.ListArray.from_arrays(pa.array(offs), pa.array(flat, type=kind.value_type)))
            yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema([schema.field(c) for c in wanted]))

    def write_index(self, directory: Path, files: Sequence[str], max_len: int) -> list[str]:
        tmp = directory / (MDS_INDEX + ".tmp")
        tmp.write_text(json.dumps({"shards": self._shards(directory, files), "version": 2}, sort_keys=True))
        tmp.replace(directory / MDS_INDEX)
        return [MDS_INDEX]

    def _shards(self, directory: Path, files: Sequence[str]) -> list[JSONObject]:
        """index.json's entry for each shard file of ``files``: its config (columns, encodings), size and samples."""
        shards = []
        for file in files:
            config, offsets, _ = _read_mds(directory / file)
            shards.append(
                {
                    **config,
                    "raw_data": {"basename": file, "bytes": int(offsets[-1]), "hashes": {}},
                    "samples": len(offsets) - 1,
                    "zip_data": None,
                }
            )
        return shards

    def _index_problems(self, directory: Path, files: Sequence[str], max_len: int) -> list[tuple[str, str]]:
        found, problems = read_index(directory, MDS_INDEX)
        if problems:
            return problems
        if not isinstance(found, dict) or not isinstance(found.get("shards"), list):
            return [(MDS_INDEX, "has no shard list (a JSON object with a list under 'shards')")]
        listed = found["shards"]
        if found.get("version") != 2:
            problems.append((MDS_INDEX, f"has version {index_value(found.get('version'))}, not 2"))
        if len(listed) != len(files):
            problems.append((MDS_INDEX, f"lists {len(listed)} shards, manifest.json lists {len(files)}"))
            return problems
        for k, (got, expected) in enumerate(zip(listed, self._shards(directory, files), strict=True)):
            problems += compare_index(MDS_INDEX, f"shard {k} ({files[k]})", got, expected, "the shard holds")
        return problems[:MAX_INDEX_PROBLEMS]


def _mds_schema(config: JSONObject) -> pa.Schema:
    """The packcli schema of an MDS shard's columns: SHARD_SCHEMA's order, then the optional columns."""
    import pyarrow as pa

    from packcli.contract import OPTIONAL_COLUMNS, SHARD_SCHEMA

    known = [*SHARD_SCHEMA, *OPTIONAL_COLUMNS]
    names = set(config["column_names"])
    fields = [f for f in known if f.name in names]
    by_name = dict(zip(config["column_names"], config["column_encodings"], strict=True))
    extra = [
        pa.field(name, pa.list_(pa.from_numpy_dtype(np.dtype(by_name[name].split(":")[1]))))
        for name in config["column_names"]
        if name not in {f.name for f in known}
    ]
    return pa.schema([*fields, *extra])


def _mds_values(data: Any, at: int, size: int, dtype: np.dtype) -> np.ndarray:
    """Decode one ndarray column value of ``size`` bytes at ``at``."""
    head = data[at]
    ndim, code = head >> 2, head & 3
    if ndim != 1:
        raise ValueError(f"an MDS column value has {ndim} dimensions; packcli columns have 1")
    shape_dtype = np.dtype(_MDS_SHAPE_DTYPES[code]).newbyteorder("<")
    count = int(np.frombuffer(data, shape_dtype, 1, at + 1)[0])
    start = at + 1 + shape_dtype.itemsize
    if start + count * dtype.itemsize != at + size:
        raise ValueError("an MDS column value's size does not match its shape")
    return np.frombuffer(data, dtype, count, start)
