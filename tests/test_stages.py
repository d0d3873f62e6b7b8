"""The stages under the pipeline, tested directly: sources, formats, the token store and shards."""

from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from packcli.errors import InputError, RecordError
from packcli.io.readers import read_batches
from packcli.io.sources import resolve_inputs
from packcli.output.layout import RowLayout
from packcli.output.rows import SHARD_SCHEMA, build_rows, read_shard, write_shard
from packcli.records.formats import DEFAULT_FIELDS, detect_format, normalize
from packcli.store.tokens import find_store
from packcli.store.writer import TokenStoreWriter

from .conftest import bare_meta, write_jsonl

# -- sources -----------------------------------------------------------------------------------------


def test_sources_sorted_deduplicated_and_numbered(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b1"}, {"text": "b2"}])
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a1"}])
    (tmp_path / "notes.txt").write_text("not an input")
    sources = resolve_inputs([str(tmp_path / "b.jsonl"), str(tmp_path)])
    assert [Path(s.path).name for s in sources] == ["a.jsonl", "b.jsonl"]  # sorted, named twice: read once
    batches = list(read_batches(sources, batch_size=1))
    assert [(Path(b.source).name, b.first_index, b.positions) for b in batches] == [
        ("a.jsonl", 0, [1]),
        ("b.jsonl", 1, [1]),
        ("b.jsonl", 2, [2]),
    ]
    assert all(b.raw_lines and isinstance(b.items[0], bytes) for b in batches)  # decoded in the workers


def test_sources_refuse_what_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        resolve_inputs([str(tmp_path / "missing.jsonl")])
    with pytest.raises(InputError, match="the pattern matches no file"):
        resolve_inputs([str(tmp_path / "*.parquet")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no"):
        resolve_inputs([str(tmp_path / "empty")])


def test_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "gaps.jsonl"
    path.write_text('{"text": "one"}\n\n\n{"text": "four"}\n')
    (batch,) = read_batches(resolve_inputs([str(path)]))
    assert batch.positions == [1, 4] and len(batch.items) == 2


# -- formats -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"messages": []}, "messages"),
        ({"conversations": []}, "conversations"),
        ({"prompt": "p", "completion": "c"}, "prompt_completion"),
        ({"instruction": "i", "output": "o"}, "alpaca"),
        ({"input_ids": [1]}, "tokenized"),
        ({"text": "t"}, "text"),
        ({"other": 1}, None),
        ([1, 2], None),
    ],
)
def test_detect_format(record: object, expected: str | None) -> None:
    assert detect_format(record, DEFAULT_FIELDS) == expected


def test_normalize_maps_sharegpt_and_keeps_template_extras() -> None:
    record = {
        "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello", "weight": 1}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    sample = normalize(record, "conversations", DEFAULT_FIELDS)
    # "weight" (axolotl's per-message training mark) is packcli's, read and removed before the template.
    assert sample.messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    assert sample.message_train == (None, True)
    assert sample.tools == record["tools"] and sample.template_kwargs == {"enable_thinking": False}
    alpaca = normalize({"instruction": "Add", "input": "1 and 2", "output": "3"}, "alpaca", DEFAULT_FIELDS)
    assert alpaca.messages == [
        {"role": "user", "content": "Add\n\n1 and 2"},
        {"role": "assistant", "content": "3"},
    ]
    assert alpaca.prompt_len == 1


@pytest.mark.parametrize(
    ("record", "fmt", "reason"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "unknown_role"),
        ({"messages": "not json"}, "messages", "wrong_type"),
        ({"text": 5}, "text", "wrong_type"),
        ({"input_ids": [1, 2], "labels": [1]}, "tokenized", "length_mismatch"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}, "messages", "wrong_type"),
        ({"prompt": "p"}, "prompt_completion", "missing_field"),
    ],
)
def test_normalize_names_what_is_wrong(record: dict, fmt: str, reason: str) -> None:
    with pytest.raises(RecordError) as info:
        normalize(record, fmt, DEFAULT_FIELDS)
    assert info.value.reason == reason


# -- the token store ---------------------------------------------------------------------------------


def test_token_store_round_trip(tmp_path: Path) -> None:
    writer = TokenStoreWriter(tmp_path / "store")
    rng = np.random.default_rng(0)
    lengths = np.array([3, 5, 2], dtype=np.int32)
    ids = rng.integers(0, 1000, int(lengths.sum())).astype(np.int32)
    labels = np.where(rng.random(len(ids)) < 0.5, ids, -100).astype(np.int32)
    writer.add(
        np.array([0, 2, 3], dtype=np.int64), lengths, ids, labels, np.array([1, 2, 1], np.int32),
        np.array([1, 0, 1], np.int32), np.array([1, 3, 4], np.int32),
    )  # fmt: skip
    store = writer.finish(bare_meta(records_read=4, dropped={"empty": 1}))
    again = find_store(tmp_path / "store")
    assert again is not None and again.meta.records_read == 4
    assert again.sample_index.tolist() == [0, 2, 3] and again.lengths.tolist() == [3, 5, 2]
    with store.open_tokens() as reader:
        got_ids, got_labels = reader.gather(store.starts[[2, 0]], store.lengths[[2, 0]])
    assert got_ids.tolist() == ids[8:10].tolist() + ids[0:3].tolist()
    assert got_labels.tolist() == labels[8:10].tolist() + labels[0:3].tolist()
    assert not list(tmp_path.glob(".tmp-*"))  # the staging directory became the store


def test_finishing_a_store_never_reads_its_token_files_back(tmp_path: Path, monkeypatch: Any) -> None:
    """The token files are hashed as they are written: finish and the load after it read none of them
    (they are the bulk of a run's bytes), and the checksums are those of the bytes, so a later lookup
    of the entry checks them."""
    from packcli.store import integrity, writer as store_writer
    from packcli.store.integrity import STAMPS

    hashed: list[str] = []
    real = store_writer.file_sha256

    def counted(path: Any) -> str:
        hashed.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(store_writer, "file_sha256", counted)
    monkeypatch.setattr(integrity, "file_sha256", counted)
    writer = TokenStoreWriter(tmp_path / "store")
    batches = [np.arange(5, dtype=np.int32), np.arange(100, 103, dtype=np.int32)]
    for i, ids in enumerate(batches):
        one = np.array([1], np.int32)
        writer.add(np.array([i]), np.array([len(ids)], np.int32), ids, -ids, one, one, one)
    meta = bare_meta()
    store = writer.finish(meta)
    assert hashed == ["samples.npz"]
    ids = np.concatenate(batches).astype("<i4").tobytes()
    assert store.meta.files["input_ids.bin"] == {"bytes": len(ids), "sha256": hashlib.sha256(ids).hexdigest()}
    labels = (-np.concatenate(batches)).astype("<i4").tobytes()
    assert store.meta.files["labels.bin"]["sha256"] == hashlib.sha256(labels).hexdigest()
    assert find_store(tmp_path / "store") is not None  # the stamps kept as it was written vouch for its files
    assert hashed == ["samples.npz"]
    (tmp_path / "store" / STAMPS).unlink()
    assert find_store(tmp_path / "store") is not None  # the checksums hold when the entry is read
    assert sorted(hashed[1:]) == ["input_ids.bin", "labels.bin", "samples.npz"]


def test_finishing_a_store_keeps_its_per_sample_arrays_once(tmp_path: Path, monkeypatch: Any) -> None:
    """The driver's memory at scale is the per-sample arrays: finish lets the batches go as it joins
    them and hands on the joined arrays, never a second copy loaded back from samples.npz."""
    from packcli.store import tokens

    loads: list[Any] = []
    real_load = np.load
    monkeypatch.setattr(tokens.np, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    writer = TokenStoreWriter(tmp_path / "store")
    for i in range(3):
        ids = np.arange(4, dtype=np.int32)
        one, first = np.array([1], np.int32), np.array([1], np.int32)
        writer.add(np.array([i]), np.array([4], np.int32), ids, ids, one, first, np.array([i], np.int32))
    del one, first
    batches = [weakref.ref(part) for column in writer._arrays.values() for part in column.pending]
    meta = bare_meta()
    store = writer.finish(meta)
    assert loads == [] and not any(c.chunks or c.pending for c in writer._arrays.values())  # nothing kept
    assert len(batches) == 18 and all(ref() is None for ref in batches)  # the batches' arrays are freed
    assert store.sample_index.tolist() == [0, 1, 2] and store.positions.tolist() == [0, 1, 2]
    again = find_store(tmp_path / "store")
    assert again is not None and again.lengths.tolist() == store.lengths.tolist() == [4, 4, 4]
    assert again.lengths.dtype == store.lengths.dtype and again.sample_index.dtype == store.sample_index.dtype


def test_the_store_writer_holds_chunks_not_one_array_per_batch(tmp_path: Path, monkeypatch: Any) -> None:
    """A worker's batch is 256 samples: 10M samples are 40,000 batches. The writer joins them into chunks
    as they come, so it holds a few large arrays per column (returned to the system when freed), not
    tens of thousands of small ones (which stay in the heap), and the store is the same."""
    from packcli.store import writer as store_writer

    monkeypatch.setattr(store_writer, "CHUNK_SAMPLES", 100)
    writer = TokenStoreWriter(tmp_path / "store")
    for b in range(60):  # 60 batches of 7 samples: 420 samples
        lengths = np.full(7, 2, np.int32)
        ids = np.arange(14, dtype=np.int32) + b
        roles = np.full(7, b % 3, np.int8) if b >= 5 else None  # roles from the sixth batch on
        index = np.arange(b * 7, b * 7 + 7)
        writer.add(index, lengths, ids, ids, lengths - 1, lengths - 1, index.astype(np.int32), sample_role=roles)
    held = [len(c.chunks) + len(c.pending) for c in (*writer._arrays.values(), writer._roles)]
    assert max(held) <= 420 // 100 + 100 // 7 + 1, held  # 4 chunks and the batches since the last
    meta = bare_meta()
    store = writer.finish(meta)
    assert store.sample_index.tolist() == list(range(420)) and store.positions.tolist() == list(range(420))
    assert store.sample_role is not None
    assert store.sample_role.tolist() == [0] * 35 + [b % 3 for b in range(5, 60) for _ in range(7)]


def test_an_unfinished_store_is_not_found(tmp_path: Path) -> None:
    writer = TokenStoreWriter(tmp_path / "store")
    writer.add(np.array([0]), np.array([2], np.int32), np.array([1, 2], np.int32), np.array([-100, 2], np.int32),
               np.array([1], np.int32), np.array([1], np.int32), np.array([1], np.int32))  # fmt: skip
    writer.abort()
    assert find_store(tmp_path / "store") is None and not any(tmp_path.iterdir())


# -- shards ------------------------------------------------------------------------------------------


def test_build_rows_positions_restart_and_padding_is_its_own_segment() -> None:
    ids = np.arange(10, 17, dtype=np.int32)
    labels = ids.copy()
    table = build_rows(
        ids, labels, np.array([3, 2, 2]), np.array([2, 1]), np.array([5, 7, 9]), RowLayout(6, pad_to_max=True)
    )
    rows = table.to_pylist()
    assert rows[0]["input_ids"] == [10, 11, 12, 13, 14, 0] and rows[0]["position_ids"] == [0, 1, 2, 0, 1, 0]
    assert rows[0]["seq_lengths"] == [3, 2, 1] and rows[0]["sample_index"] == [5, 7, -1]
    assert rows[1]["labels"] == [15, 16, -100, -100, -100, -100] and rows[1]["position_ids"] == [0, 1, 0, 1, 2, 3]
    assert table.schema == SHARD_SCHEMA


@pytest.mark.parametrize(
    "layout",
    [
        RowLayout(8),
        RowLayout(8, pad_multiple=4, loss_weighting="sqrt", sample_roles=True, sources=True, trees=True),
        RowLayout(8, images=True),
        RowLayout(8, loss_weighting="sample", images=True, image_bytes=True, image_spans=True),
    ],
)
def test_a_layouts_column_names_are_those_of_its_schema(layout: RowLayout) -> None:
    """The manifest lists the columns by these names, found without pyarrow (a cache hit does not import it)."""
    assert layout.columns() == layout.schema().names


@pytest.mark.parametrize("output_format", ["parquet", "arrow"])
def test_write_and_read_a_shard(tmp_path: Path, output_format: str) -> None:
    table = build_rows(np.arange(6, dtype=np.int32), np.arange(6, dtype=np.int32), np.array([2, 4]), np.array([1, 1]),
                       np.array([0, 1]), RowLayout(8))  # fmt: skip
    path = tmp_path / f"shard{'.parquet' if output_format == 'parquet' else '.arrow'}"
    entry = write_shard([table.slice(0, 1), table.slice(1, 1)], path, output_format)
    assert entry.rows == 2 and entry.tokens == 6 and len(entry.sha256) == 64
    back = read_shard(path)
    assert back.to_pylist() == table.to_pylist() and back.schema == SHARD_SCHEMA
    assert json.dumps(entry.to_dict())  # manifest entries are plain JSON
    assert isinstance(back, pa.Table)


def test_a_new_shard_format_is_one_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry is the only place that knows formats: a registered format is written and read back."""
    import pyarrow.feather as feather

    from packcli.output import formats as shard_formats

    class Feather(shard_formats.ArrowStreamFormat):
        name = "feather"
        extension = ".feather"

        def writer(self, path: Path, schema: pa.Schema) -> shard_formats.ShardWriter:
            tables: list[pa.Table] = []

            class _Writer:
                def write(self, table: pa.Table) -> None:
                    tables.append(table)

                def close(self) -> None:
                    feather.write_feather(pa.concat_tables(tables) if tables else schema.empty_table(), str(path))

            return _Writer()

        def batches(self, path: Path, columns: object, batch_rows: int):  # type: ignore[override]
            yield from feather.read_table(str(path)).to_batches(batch_rows)

        def schema(self, path: Path) -> pa.Schema:
            return feather.read_table(str(path)).schema

        def read(self, path: Path) -> pa.Table:
            return feather.read_table(str(path))

    fmt = Feather()
    monkeypatch.setitem(shard_formats.FORMATS, fmt.name, fmt)
    monkeypatch.setitem(shard_formats._BY_EXTENSION, fmt.extension, fmt)
    table = build_rows(np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int32), np.array([4]), np.array([1]),
                       np.array([0]), RowLayout(8))  # fmt: skip
    entry = write_shard([table], tmp_path / "s.feather", "feather")
    assert entry.rows == 1 and read_shard(tmp_path / "s.feather").to_pylist() == table.to_pylist()
    assert [b.num_rows for b in shard_formats.shard_batches(tmp_path / "s.feather")] == [1]


def test_every_option_has_one_concern_and_only_tokenization_keys_the_cache(tmp_path: Path) -> None:
    from dataclasses import fields

    from packcli.config import OPTION_GROUPS, PackConfig
    from packcli.run.pipeline import tokenized_inputs

    grouped = [name for names in OPTION_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(f.name for f in fields(PackConfig)) and len(grouped) == len(set(grouped))
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "packing saves compute"}] * 3)
    base = {"inputs": (str(data),), "cache_dir": str(tmp_path / "cache"), "num_proc": 1}
    with tokenized_inputs(PackConfig(**base)) as first:
        assert first.cache == "miss"
    other_concerns = {"max_len": 64, "seed": 5, "algorithm": "bfd", "output": str(tmp_path / "o"), "rows_per_shard": 7}
    with tokenized_inputs(PackConfig(**base, **other_concerns)) as again:
        assert again.cache == "hit"  # packing, output and run options never re-tokenize
    with tokenized_inputs(PackConfig(**base, add_eos=False)) as changed:
        assert changed.cache == "miss"  # a tokenization option does


def test_inputs_hashed_beside_the_tokenizer_load_hash_as_before(tmp_path: Path, chat_jsonl: Path, pack) -> None:
    """Without the cache the inputs are hashed in a thread while the tokenizer loads: same manifest."""
    pack(chat_jsonl, "--max-len", "256", "-o", tmp_path / "cached")
    pack(chat_jsonl, "--max-len", "256", "-o", tmp_path / "uncached", "--no-cache")
    cached = json.loads((tmp_path / "cached" / "manifest.json").read_text())
    uncached = json.loads((tmp_path / "uncached" / "manifest.json").read_text())
    assert cached["inputs"] == uncached["inputs"]
    assert cached["inputs"][0]["blake2b"]
    assert cached["shards"] == uncached["shards"]


def test_a_remembered_record_count_is_counted_again_when_the_file_changes(tmp_path: Path) -> None:
    import os

    from packcli.io.readers import count_records

    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}] * 3)
    (source,) = resolve_inputs([str(path)], None)
    assert count_records(source) == 3
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n" + json.dumps({"text": "y"}) + "\n")  # a blank line is not a record
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert count_records(source) == 4
