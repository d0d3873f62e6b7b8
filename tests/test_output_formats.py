"""The mds and megatron output formats, per-sample padding and loss weights at the CLI.

Each format is read here by a reader written from its consumer's documented layout (not packcli's own
reader), and its samples, boundaries and masks are compared with the same run written as Parquet:
MosaicML streaming's MDS (index.json + shard files) and Megatron-Bridge's packed SFT Parquet with
its collate function's shift (loss_mask[t] trains the label at t, token t + 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from packcli.contract import IGNORE_INDEX, SHARD_SCHEMA
from packcli.output.formats import format_of, read_shard

from .conftest import one_error_line, read_rows


def _samples(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each sample by sample_index: its real tokens and labels, its padded length, its loss weights."""
    out = {}
    for row in rows:
        start = 0
        real = row.get("seq_lengths_unpadded") or row["seq_lengths"]
        for n, m, index in zip(row["seq_lengths"], real, row["sample_index"], strict=True):
            if index >= 0:
                sample = {"ids": row["input_ids"][start : start + m], "labels": row["labels"][start : start + m]}
                if "loss_weights" in row:
                    sample["weights"] = row["loss_weights"][start : start + m]
                out[index] = {**sample, "padded": n}
            start += n
    return out


# -- MDS, read as streaming's reader does ------------------------------------------------------------


def _read_mds(out: Path) -> list[dict[str, Any]]:
    """Read an MDS dataset from its index.json and shard files, following the MDS layout."""
    index = json.loads((out / "index.json").read_text())
    assert index["version"] == 2
    rows = []
    for shard in index["shards"]:
        assert shard["format"] == "mds" and shard["version"] == 2 and shard["compression"] is None
        assert shard["column_names"] == sorted(shard["column_names"])
        data = (out / shard["raw_data"]["basename"]).read_bytes()
        assert shard["raw_data"]["bytes"] == len(data) and shard["zip_data"] is None
        n = int(np.frombuffer(data, "<u4", 1)[0])
        assert n == shard["samples"]
        offsets = np.frombuffer(data, "<u4", n + 1, 4)
        assert offsets[-1] == len(data)
        for r in range(n):
            at = int(offsets[r])
            # one uint32 size per variable-size column (every column here), then the columns' bytes
            sizes = np.frombuffer(data, "<u4", len(shard["column_names"]), at)
            at += 4 * len(sizes)
            row = {}
            for name, encoding, size in zip(shard["column_names"], shard["column_encodings"], sizes, strict=True):
                kind, dtype = encoding.split(":")
                assert kind == "ndarray"
                head = data[at]  # ndim << 2 | shape dtype code (0 uint8, 1 uint16, 2 uint32)
                assert head >> 2 == 1
                shape_dtype = ("<u1", "<u2", "<u4")[head & 3]
                count = int(np.frombuffer(data, shape_dtype, 1, at + 1)[0])
                start = at + 1 + np.dtype(shape_dtype).itemsize
                assert start + count * np.dtype(dtype).itemsize == at + size
                row[name] = np.frombuffer(data, np.dtype(dtype).newbyteorder("<"), count, start).tolist()
                at += int(size)
            assert at == offsets[r + 1]
            rows.append(row)
    return rows


@pytest.mark.parametrize("extra", [[], ["--pad-to-multiple-of", "8", "--loss-weighting", "sample"]])
def test_mds_rows_equal_the_parquet_rows(extra: list[str], pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    args = [chat_jsonl, "--max-len", "256", "--quiet", "--rows-per-shard", "7", *extra]
    pack(*args, "-o", tmp_path / "parquet")
    pack(*args, "-o", tmp_path / "mds", "--output-format", "mds")
    parquet, mds = read_rows(tmp_path / "parquet"), _read_mds(tmp_path / "mds")
    assert len(parquet) > 7  # several shards
    assert [{k: r[k] for k in sorted(r)} for r in parquet] == mds
    manifest = json.loads((tmp_path / "mds" / "manifest.json").read_text())
    assert manifest["index_files"] == ["index.json"]
    assert manifest["columns"] == list(parquet[0])
    assert [s["file"] for s in manifest["shards"]] == sorted(p.name for p in (tmp_path / "mds").glob("*.mds"))
    # packcli's own reader gives the same rows back (stats, inspect and verify read through it)
    back = [r for s in manifest["shards"] for r in read_shard(tmp_path / "mds" / s["file"]).to_pylist()]
    assert back == parquet
    assert format_of(tmp_path / "mds" / manifest["shards"][0]["file"]).name == "mds"


# -- Megatron-Bridge packed Parquet, read as its collate function does ------------------------------


def _megatron_samples(out: Path) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """Per sample: the (input, label) pairs Megatron trains and its stored tokens; plus each row's runtime length."""
    samples: dict[int, dict[str, Any]] = {}
    runtime_rows = []
    for path in sorted(out.glob("*.idx.parquet")):
        table = pq.read_table(path, columns=["input_ids", "seq_start_id", "loss_mask", "sample_index"])
        assert str(table.schema.field("loss_mask").type) == "list<element: int8>"
        for row in table.to_pylist():
            ids, mask = row["input_ids"], row["loss_mask"]
            assert len(mask) == len(ids) and row["seq_start_id"][0] == 0
            bounds = [*row["seq_start_id"], len(ids)]
            runtime_rows.append(0)
            for k, index in enumerate(row["sample_index"]):
                s, e = bounds[k], bounds[k + 1]
                tokens, labels, loss = ids[s : e - 1], ids[s + 1 : e], mask[s : e - 1]
                trained = [(t, labels[t]) for t in range(len(tokens)) if loss[t]]
                samples[index] = {"stored": ids[s:e], "trained": trained, "runtime": e - s - 1}
                runtime_rows[-1] += e - s - 1
    return samples, runtime_rows


@pytest.mark.parametrize("cp", [1, 2])
def test_megatron_samples_and_masks_round_trip(cp: int, pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    args = [chat_jsonl, "--max-len", "256", "--quiet", "--context-parallel", str(cp)]
    pack(*args, "-o", tmp_path / "parquet")
    pack(*args, "-o", tmp_path / "megatron", "--output-format", "megatron")
    expected = _samples(read_rows(tmp_path / "parquet"))
    got, runtime_rows = _megatron_samples(tmp_path / "megatron")
    assert set(got) == set(expected)
    for index, sample in expected.items():
        stored, n = got[index]["stored"], len(sample["ids"])
        assert stored[:n] == sample["ids"]
        # packcli's unshifted label at t + 1 is what Megatron trains at input position t
        trained = [(t - 1, label) for t, label in enumerate(sample["labels"]) if label != IGNORE_INDEX]
        assert got[index]["trained"] == trained
        if cp > 1:  # what Megatron runs on (stored - 1 tokens) is a multiple of 2 x CP
            assert got[index]["runtime"] % (2 * cp) == 0 and got[index]["runtime"] - 2 * cp < n - 1
        else:
            assert len(stored) == n
    assert max(len(v["stored"]) for v in got.values()) <= 256
    metadata = json.loads((tmp_path / "megatron" / "packing_metadata.json").read_text())
    assert isinstance(metadata, list) and len(metadata) == 1
    meta = metadata[0]
    assert meta["pack_size"] == 256
    assert meta["dataset_max_seqlen"] == max(v["runtime"] for v in got.values())
    assert meta["min_packed_seqlen"] == min(runtime_rows)
    assert meta["max_samples_per_bin"] >= 2
    assert meta["packing_factor"] == round(len(got) / len(runtime_rows), 2)
    assert meta["packing_efficiency"] == round(sum(runtime_rows) / len(runtime_rows) / 256 * 100, 2)


@pytest.mark.parametrize("fmt", ["mds", "megatron"])
def test_new_formats_verify_and_overwrite(fmt: str, pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    out = tmp_path / "out"
    args = [chat_jsonl, "--max-len", "256", "--quiet", "--output-format", fmt, "--context-parallel", "2", "-o", out]
    pack(*args)
    result = CliRunner().invoke(app, ["verify", str(out)])
    assert result.exit_code == 0, result.output
    pack(*args, "--overwrite")  # the index files are the output's own: --overwrite replaces them
    index = {"mds": "index.json", "megatron": "packing_metadata.json"}[fmt]
    assert (out / index).is_file()
    # a damaged shard is reported by verify
    shard = next(p for p in out.iterdir() if p.name.startswith("shard-"))
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["verify", str(out)])
    assert result.exit_code != 0 and "sha256" in result.output


# -- padding and weights at the CLI ----------------------------------------------------------------


def test_rows_never_exceed_max_len_and_plan_on_padded_lengths(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    pack(chat_jsonl, "--max-len", "96", "--pad-to-multiple-of", "32", "-o", tmp_path / "out", "--quiet")
    rows = read_rows(tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["columns"][-1] == "seq_lengths_unpadded"
    for row in rows:
        assert len(row["input_ids"]) <= 96
        assert all(n % 32 == 0 for n in row["seq_lengths"])
    real = sum(sum(r["seq_lengths_unpadded"]) for r in rows)
    written = sum(len(r["input_ids"]) for r in rows)
    assert manifest["tokens"] == real and manifest["alignment_padding_tokens"] == written - real > 0
    assert manifest["padding_tokens"] == manifest["rows"] * 96 - real
    # samples of 65..96 tokens would fit unpadded but not padded to 128: they are dropped, and counted
    assert manifest["counts"]["dropped"].get("too_long", 0) > 0


def test_megatron_drops_a_sample_that_fits_only_unpadded(pack: Any, tmp_path: Path) -> None:
    from .conftest import write_jsonl

    data = write_jsonl(tmp_path / "t.jsonl", [{"input_ids": list(range(1, 33))}, {"input_ids": list(range(1, 30))}])
    pack(data, "--max-len", "32", "--context-parallel", "2", "--output-format", "megatron", "-o", tmp_path / "o")
    # Megatron runs a 32-token sample as 31 tokens, padded to 32: stored as 33, more than --max-len.
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["counts"]["dropped"] == {"too_long": 1} and manifest["counts"]["packed"] == 1
    failed = pack(
        data,
        "--max-len",
        "32",
        "--context-parallel",
        "2",
        "--output-format",
        "megatron",
        "--overflow",
        "error",
        "-o",
        tmp_path / "e",
        expect=1,
    )
    line = one_error_line(failed)
    assert "33 tokens" not in line and "the most that fits in --max-len 32 once padded to a multiple of 4" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pad-to-multiple-of", "0"], "--pad-to-multiple-of must be between 1"),
        (["--context-parallel", "0"], "--context-parallel must be between 1"),
        (["--loss-weighting", "mean"], "--loss-weighting must be one of token, sample, sqrt"),
        (["--output-format", "npy"], "--output-format must be one of parquet, arrow, mds, megatron"),
        (
            ["--max-len", "4", "--pad-to-multiple-of", "8"],
            "--max-len 4 is too short for samples padded to a multiple of 8",
        ),
        (["--output-format", "megatron", "--pad-to-max"], "--pad-to-max does not apply to --output-format megatron"),
        (["--max-len", "100", "--context-parallel", "4", "--pad-to-max"], "make --max-len (100) a multiple of 8"),
        (["--output-format", "megatron", "--loss-weighting", "sample"], "does not apply to --output-format megatron"),
    ],
)
def test_bad_options_are_one_line_errors(
    args: list[str], message: str, pack: Any, chat_jsonl: Path, tmp_path: Path
) -> None:
    result = pack(chat_jsonl, *args, "-o", tmp_path / "out", expect=2)
    assert message in one_error_line(result)
    assert not (tmp_path / "out").exists()


def test_default_output_has_no_new_columns(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    pack(chat_jsonl, "--max-len", "256", "-o", tmp_path / "a", "--quiet")
    pack(chat_jsonl, "--max-len", "256", "-o", tmp_path / "b", "--quiet", "--pad-to-multiple-of", "1")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["columns"] == list(SHARD_SCHEMA.names)
    assert "index_files" not in manifest and manifest["alignment_padding_tokens"] == 0
    other = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert [s["sha256"] for s in manifest["shards"]] == [s["sha256"] for s in other["shards"]]


def test_library_dataset_of_the_new_formats(chat_jsonl: Path, tmp_path: Path, cache_dir: Path) -> None:
    import packcli

    common = {"num_proc": 1, "cache_dir": cache_dir, "loss_weighting": "sample", "pad_to_multiple_of": 4}
    expected = packcli.pack(chat_jsonl, 256, tmp_path / "p", **common).dataset().to_list()
    got = packcli.pack(chat_jsonl, 256, tmp_path / "m", output_format="mds", **common).dataset().to_list()
    assert got == expected and "loss_weights" in got[0]


def test_verify_finds_broken_padding_and_weights(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    from typer.testing import CliRunner

    from packcli.cli import app

    out = tmp_path / "out"
    pack(
        chat_jsonl, "--max-len", "256", "--pad-to-multiple-of", "8", "--loss-weighting", "sample", "-o", out, "--quiet"
    )
    result = CliRunner().invoke(app, ["verify", str(out)])
    assert result.exit_code == 0, result.output
    shard = next(out.glob("shard-*.parquet"))
    rows = pq.read_table(shard).to_pylist()
    row = rows[0]
    real, n = row["seq_lengths_unpadded"][0], row["seq_lengths"][0]
    assert n > real, "the test needs a first sample with padding"
    row["loss_weights"][0] = 0.5  # the first label is -100: no weight may sit there
    row["seq_lengths_unpadded"][0] = n + 1  # longer than its segment
    schema = pq.read_schema(shard)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), shard)
    result = CliRunner().invoke(app, ["verify", str(out)])
    assert result.exit_code == 1
    assert "1 row has loss_weights that are negative" in result.stderr
    assert "1 row has seq_lengths_unpadded values that are not the real length" in result.stderr


def test_split_cuts_pieces_that_fit_once_padded(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    # --max-len 100 with a multiple of 32: a piece may hold 96 tokens (padded to 96), not 100.
    pack(
        chat_jsonl,
        "--max-len",
        "100",
        "--pad-to-multiple-of",
        "32",
        "--overflow",
        "split",
        "-o",
        tmp_path / "o",
        "--quiet",
    )
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["counts"]["dropped"] == {} and manifest["counts"]["split"]["records_split"] > 0
    rows = read_rows(tmp_path / "o")
    assert max(n for r in rows for n in r["seq_lengths_unpadded"]) <= 96
    assert all(len(r["input_ids"]) <= 100 and all(n % 32 == 0 for n in r["seq_lengths"]) for r in rows)
    assert any(p > 0 for r in rows for p in r["piece_index"])


def test_the_format_registry_and_the_output_format_choices_agree() -> None:
    from packcli.config import CHOICES
    from packcli.output.formats import FORMATS

    assert list(FORMATS) == list(CHOICES["output_format"])


def test_a_registered_format_is_found_by_its_longest_extension(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from packcli.output import formats

    monkeypatch.setattr(formats, "FORMATS", dict(formats.FORMATS))
    monkeypatch.setattr(formats, "_BY_EXTENSION", dict(formats._BY_EXTENSION))

    class Packed(formats.ArrowStreamFormat):
        name = "packed-arrow"
        extension = ".packed.arrow"

    fmt = formats.register(Packed())
    assert formats.shard_format("packed-arrow") is fmt
    assert formats.format_of(tmp_path / "s.packed.arrow") is fmt
    assert formats.format_of(tmp_path / "s.arrow").name == "arrow"
    assert formats.format_of(tmp_path / "s.idx.parquet").name == "megatron"
    with pytest.raises(ValueError, match=r"known: \.packed\.arrow, \.idx\.parquet, \.parquet, \.arrow, \.mds"):
        formats.format_of(tmp_path / "s.csv")

    class Renamed(formats.ArrowStreamFormat):
        name = "packed-arrow"
        extension = ".parrow"

    formats.register(Renamed())  # a format registered again under its name leaves its old extension
    with pytest.raises(ValueError, match=r"known: \.idx\.parquet, \.parquet, \.parrow, \.arrow, \.mds"):
        formats.format_of(tmp_path / "s.csv")


def test_training_reads_a_registered_format_through_the_registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A format that ``datasets`` cannot open as it is (here Feather) is read back as packcli rows."""
    import pyarrow as pa
    import pyarrow.feather as feather

    from packcli.output import formats
    from packcli.train.checks import load_rows

    class Feather(formats.ShardFormat):
        name = "feather"
        extension = ".feather"

        def writer(self, path: Path, schema: pa.Schema) -> formats.ShardWriter:
            class _Writer:
                def write(self, table: pa.Table) -> None:
                    feather.write_feather(table, str(path))

                def close(self) -> None:
                    pass

            return _Writer()

        def batches(self, path: Path, columns: Any, batch_rows: int) -> Any:
            yield from feather.read_table(str(path), columns=columns).to_batches(batch_rows)

        def schema(self, path: Path) -> pa.Schema:
            return feather.read_table(str(path)).schema

    monkeypatch.setattr(formats, "FORMATS", dict(formats.FORMATS))
    monkeypatch.setattr(formats, "_BY_EXTENSION", dict(formats._BY_EXTENSION))
    fmt = formats.register(Feather())
    rows = [
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 2], "seq_lengths": [3]}
        | {"sample_index": [0], "piece_index": [0]}
    ]
    writer = fmt.writer(tmp_path / "shard-00000-of-00001.feather", SHARD_SCHEMA)
    writer.write(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA))
    writer.close()
    (tmp_path / "manifest.json").write_text(json.dumps({"shards": [{"file": "shard-00000-of-00001.feather"}]}))
    assert load_rows(tmp_path).to_list() == rows


def test_rejects_cannot_take_the_name_of_an_index_file(pack: Any, chat_jsonl: Path, tmp_path: Path) -> None:
    from packcli import owned
    from packcli.output.formats import FORMATS

    assert set(owned.INDEX_FILES) == {name for f in FORMATS.values() for name in f.index_files}
    out = tmp_path / "out"
    result = pack(chat_jsonl, "--output-format", "mds", "-o", out, "--rejects", out / "index.json", expect=2)
    assert "collides with a file packcli writes in the output" in one_error_line(result)


# -- verify checks every file a trainer reads: the tamper suite of the MDS and Megatron outputs ----
#
# Each case damages one file a trainer's reader opens (MDS's index.json, Megatron's packing metadata
# or columns, the loss weights) so that every checksum still holds, and verify must name that file.

TAMPER_FORMATS = {
    "mds": ["--output-format", "mds", "--loss-weighting", "sample"],
    "megatron": ["--output-format", "megatron"],
    "parquet": ["--loss-weighting", "sample"],
    "parquet-sqrt": ["--loss-weighting", "sqrt"],
}


@pytest.fixture(scope="module")
def tamper_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each format packed once (several shards, samples padded for context parallelism 2), to copy per case."""
    from typer.testing import CliRunner

    from packcli.cli import app

    from .conftest import make_conversations, write_jsonl

    root = tmp_path_factory.mktemp("tamper")
    data = write_jsonl(root / "chat.jsonl", [{"messages": m} for m in make_conversations(40, seed=3, max_words=24)])
    outputs = {}
    for name, extra in TAMPER_FORMATS.items():
        out = root / name
        args = [data, "--max-len", "256", "--rows-per-shard", "5", "--context-parallel", "2", *extra]
        argv = ["pack", *map(str, args), "-o", str(out), "--quiet", "--num-proc", "1", "--cache-dir", str(root / "c")]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        outputs[name] = out
    return outputs


def _verify(out: Path) -> Any:
    from typer.testing import CliRunner

    from packcli.cli import app

    return CliRunner().invoke(app, ["verify", str(out)])


def _edit_json(name: str, edit: Any) -> Any:
    def tamper(out: Path) -> None:
        path = out / name
        value = json.loads(path.read_text())
        value = edit(value) or value
        path.write_text(json.dumps(value))

    return tamper


def _swap_columns(index: dict[str, Any]) -> None:
    names = index["shards"][0]["column_names"]
    i, j = names.index("input_ids"), names.index("labels")
    names[i], names[j] = names[j], names[i]


def _set(index: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    *head, last = path
    for key in head:
        index = index[key]
    index[last] = value(index[last])


def _unlink(name: str) -> Any:
    return lambda out: (out / name).unlink()


def _write(name: str, text: str) -> Any:
    return lambda out: (out / name).write_text(text)


def _rewrite_shards(out: Path, edit: Any) -> None:
    """Rewrite every shard with ``edit(rows)`` applied, in its format; put new checksums (and index) in place."""
    import pyarrow as pa

    from packcli.contract import file_sha256
    from packcli.output.formats import FORMATS, format_of

    manifest = json.loads((out / "manifest.json").read_text())
    fmt = format_of(out / manifest["shards"][0]["file"])
    for entry in manifest["shards"]:
        path = out / entry["file"]
        if fmt.name == "mds":  # packcli's columns, written back by its MDS writer
            table = read_shard(path)
            rows = table.to_pylist()
            edit(rows)
            writer = fmt.writer(path, table.schema)
            writer.write(pa.Table.from_pylist(rows, schema=table.schema))
            writer.close()
        else:  # Parquet and Megatron's Parquet: the stored columns
            schema = pq.read_schema(path)
            rows = pq.read_table(path).to_pylist()
            edit(rows)
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        entry["sha256"] = file_sha256(path)
    (out / "manifest.json").write_text(json.dumps(manifest))
    if fmt.name == "mds":
        FORMATS["mds"].write_index(out, [s["file"] for s in manifest["shards"]], manifest["max_len"])


def _each_row(edit_row: Any) -> Any:
    return lambda out: _rewrite_shards(out, lambda rows: [edit_row(row) for row in rows])


def _double_weights(row: dict[str, Any]) -> None:
    row["loss_weights"] = [2 * w for w in row["loss_weights"]]


def _shift_starts(row: dict[str, Any]) -> None:
    if len(row["seq_start_id"]) > 1:
        row["seq_start_id"][1] += 1


def _mask_last_token(row: dict[str, Any]) -> None:
    row["loss_mask"][-1] = 1


def _set_option(key: str, value: Any) -> Any:
    return _edit_json("manifest.json", lambda m: m["options"].__setitem__(key, value))


TAMPERS = {
    # MDS: index.json is what streaming's reader decodes the shards by
    "mds-columns-swapped": ("mds", _edit_json("index.json", _swap_columns), "index.json", "has column_names"),
    "mds-sample-count": (
        "mds",
        _edit_json("index.json", lambda i: _set(i, ("shards", 1, "samples"), lambda n: n + 1)),
        "index.json",
        "shard 1 (shard-00001-of-",
    ),
    "mds-dtype": (
        "mds",
        _edit_json("index.json", lambda i: _set(i, ("shards", 0, "column_encodings", 0), lambda e: "ndarray:int64")),
        "index.json",
        "has column_encodings",
    ),
    "mds-byte-size": (
        "mds",
        _edit_json("index.json", lambda i: _set(i, ("shards", 2, "raw_data", "bytes"), lambda n: n - 4)),
        "index.json",
        "has raw_data",
    ),
    "mds-shard-name": (
        "mds",
        _edit_json("index.json", lambda i: _set(i, ("shards", 0, "raw_data", "basename"), lambda n: "other.mds")),
        "index.json",
        "has raw_data",
    ),
    "mds-empty-shard-list": (
        "mds",
        _edit_json("index.json", lambda i: _set(i, ("shards",), lambda s: [])),
        "index.json",
        "lists 0 shards, manifest.json lists",
    ),
    "mds-no-shard-list": ("mds", _write("index.json", "{}"), "index.json", "has no shard list"),
    "mds-not-json": ("mds", _write("index.json", '{"shards": ['), "index.json", "cannot be read"),
    "mds-index-deleted": ("mds", _unlink("index.json"), "index.json", "is missing"),
    "mds-weights-doubled": ("mds", _each_row(_double_weights), "shard-00000-of-", "not the sample weighting"),
    # Megatron: the packing metadata, and the columns its dataset reads (seq_start_id, loss_mask)
    "megatron-pack-size": (
        "megatron",
        _edit_json("packing_metadata.json", lambda m: _set(m, (0, "pack_size"), lambda n: 2 * n)),
        "packing_metadata.json",
        "has pack_size 512 where the output gives 256",
    ),
    "megatron-max-seqlen": (
        "megatron",
        _edit_json("packing_metadata.json", lambda m: _set(m, (0, "dataset_max_seqlen"), lambda n: n - 1)),
        "packing_metadata.json",
        "has dataset_max_seqlen",
    ),
    "megatron-packing-factor": (
        "megatron",
        _edit_json("packing_metadata.json", lambda m: _set(m, (0, "packing_factor"), lambda x: x + 0.5)),
        "packing_metadata.json",
        "has packing_factor",
    ),
    "megatron-key-removed": (
        "megatron",
        _edit_json("packing_metadata.json", lambda m: [m[0].pop("min_packed_seqlen"), m][1]),
        "packing_metadata.json",
        "lacks min_packed_seqlen",
    ),
    "megatron-not-a-list": (
        "megatron",
        _edit_json("packing_metadata.json", lambda m: m[0]),
        "packing_metadata.json",
        "is not a JSON list",
    ),
    "megatron-metadata-deleted": (
        "megatron",
        _unlink("packing_metadata.json"),
        "packing_metadata.json",
        "is missing",
    ),
    "megatron-seq-start-id": ("megatron", _each_row(_shift_starts), "shard-00000-of-", "seq_start_id does not match"),
    "megatron-loss-mask": ("megatron", _each_row(_mask_last_token), "shard-00000-of-", "loss_mask is 1 on a sample"),
    # loss_weights: values recomputed from the labels and seq_lengths, by the weighting the manifest records
    "parquet-weights-doubled": ("parquet", _each_row(_double_weights), "shard-00000-of-", "not the sample weighting"),
    "sqrt-weights-doubled": ("parquet-sqrt", _each_row(_double_weights), "shard-00000-of-", "1/sqrt(n) on each"),
    "weighting-says-sqrt": ("parquet", _set_option("loss_weighting", "sqrt"), "shard-00000-of-", "not the sqrt"),
    "weighting-says-token": ("parquet", _set_option("loss_weighting", "token"), "shard-00000-of-", "--loss-weighting"),
    "weights-zeroed": (
        "parquet",
        _each_row(lambda row: row.__setitem__("loss_weights", [0.0] * len(row["loss_weights"]))),
        "shard-00000-of-",
        "not the sample weighting",
    ),
}


@pytest.mark.parametrize("case", TAMPERS)
def test_verify_names_each_tampered_file(case: str, tamper_outputs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    fmt, tamper, file, message = TAMPERS[case]
    out = tmp_path / "out"
    shutil.copytree(tamper_outputs[fmt], out)
    before = _verify(out)
    assert before.exit_code == 0 and before.stdout.startswith(f"OK {out}"), before.output
    tamper(out)
    result = _verify(out)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.splitlines()
    assert any(line.startswith(file) and ": " in line and message in line for line in lines), (case, lines)
    assert lines[-1].endswith(f"in {out}")


@pytest.mark.parametrize("fmt", list(TAMPER_FORMATS))
def test_stats_verify_and_manifest_count_tokens_alike(fmt: str, tamper_outputs: dict[str, Path]) -> None:
    """Alignment padding (here context parallelism 2) is not in tokens: the manifest's definition, everywhere."""
    from typer.testing import CliRunner

    from packcli.cli import app

    out = tamper_outputs[fmt]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["alignment_padding_tokens"] > 0, "the test needs padded samples"
    stats = json.loads(CliRunner().invoke(app, ["stats", str(out), "--json"]).stdout)
    report = json.loads(CliRunner().invoke(app, ["verify", str(out), "--json"]).stdout)
    for key in ("tokens", "alignment_padding_tokens", "padding_tokens", "fill", "lower_bound_l1", "lower_bound_l2"):
        assert stats[key] == manifest[key], key
    assert report["sample_tokens"] == manifest["tokens"]
    assert report["alignment_padding_tokens"] == manifest["alignment_padding_tokens"]
    assert report["tokens"] == sum(s["tokens"] for s in manifest["shards"])  # what the rows hold, as before
    assert report["index_files"] == manifest.get("index_files", [])
    line = CliRunner().invoke(app, ["verify", str(out)]).stdout
    written = report["tokens"] - manifest["tokens"]
    assert f"{manifest['tokens']:,} tokens and {written:,} padding tokens, " in line


def test_the_write_allocates_with_jemalloc_or_the_system_malloc_and_puts_the_callers_pool_back(
    pack: Any, chat_jsonl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa

    from packcli.output import write

    seen: list[str] = []
    real = write._write_all

    def watching(*args: Any, **kwargs: Any) -> Any:
        seen.append(pa.default_memory_pool().backend_name)
        return real(*args, **kwargs)

    monkeypatch.setattr(write, "_write_all", watching)
    before = pa.default_memory_pool()
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    try:
        pack(chat_jsonl, "-o", tmp_path / "out", "--no-cache", "-q")
        try:
            built = pa.jemalloc_memory_pool().backend_name
        except NotImplementedError:
            built = "system"
        assert seen == [built]
        assert pa.default_memory_pool().backend_name == "mimalloc"  # a library call leaves its caller's pool
    finally:
        pa.set_memory_pool(before)


def test_a_shards_token_ids_are_read_from_the_buffers_of_any_chunks_and_slices() -> None:
    import pyarrow as pa

    from packcli.output.rows import _token_ids

    lists = pa.array([[1, 2], [3], [], [4, 5, 6], [7]], pa.list_(pa.int32()))
    columns = [
        pa.chunked_array([lists]),
        pa.chunked_array([lists.slice(1, 3)]),
        pa.chunked_array([lists.slice(1, 2), lists.slice(3), lists.slice(0, 0)]),
        pa.chunked_array([], pa.list_(pa.int32())),
    ]
    for column in columns:
        expected = [v for chunk in column.chunks for row in chunk.to_pylist() for v in row]
        got = _token_ids(column)
        assert got.dtype == np.int32 and got.tolist() == expected


# Runs the command line given in argv, then prints which of the modules that a pack, verify or stats has no
# use for were imported (``stats`` alone uses packcli.results.stats).
UNUSED_IMPORTS = """
import sys
from packcli.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    assert not exc.code, exc.code
unused = ["pyarrow.compute", "pandas"] + (["packcli.results.stats"] if sys.argv[1] != "stats" else [])
print(" ".join(m for m in unused if m in sys.modules))
"""


def test_pack_verify_and_stats_import_neither_pyarrow_compute_nor_pandas(chat_jsonl: Path, tmp_path: Path) -> None:
    """pyarrow.compute costs 26 ms to import, pandas 0.16 s: the write and the readers of the shards read
    the list columns' buffers instead. Only ``stats`` imports its own result types (6.5 ms)."""
    import subprocess
    import sys

    out = tmp_path / "out"
    for argv in (
        ["pack", str(chat_jsonl), "--max-len", "256", "--no-cache", "--num-proc", "1", "-q", "-o", str(out)],
        ["verify", str(out), "-q"],
        ["stats", str(out), "--json"],
    ):
        command = [sys.executable, "-c", UNUSED_IMPORTS, *argv]
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines()[-1].split() == [], argv[0]
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    rows = read_rows(out)
    assert sum(entry["tokens"] for entry in manifest["shards"]) == sum(len(r["input_ids"]) for r in rows)
    assert max(entry["max_token_id"] for entry in manifest["shards"]) == max(max(r["input_ids"]) for r in rows)


def test_list_columns_read_from_their_buffers_equal_pyarrows_reading() -> None:
    """``output.columns.from_buffers`` gives pyarrow's lengths and values for a list of numbers without a null,
    sliced or not; and None (its callers read through pyarrow) for a null row or value, bools, large lists,
    strings and an empty column."""
    import itertools

    import pyarrow as pa

    from packcli.output.columns import from_buffers, list_parts, values_hold_null

    def pyarrows(column: pa.Array) -> tuple[list[int], list[Any]]:
        offsets = column.offsets.to_pylist()
        return [b - a for a, b in itertools.pairwise(offsets)], column.flatten().to_pylist()

    for value_type in (pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.float32(), pa.float64()):
        column = pa.array([[1, 2], [3], [], [4, 5, 6], [7]], pa.list_(value_type))
        for part in (column, column.slice(1, 3), column.slice(3), column.slice(2, 1)):
            read = from_buffers(part)
            assert (read[0].tolist(), read[1].tolist()) == tuple(x.tolist() for x in list_parts(part))
            assert read is not None
            lengths, values = read
            assert lengths.dtype == np.int64 and values.dtype == value_type.to_pandas_dtype()
            assert (lengths.tolist(), values.tolist()) == pyarrows(part)
            assert not values_hold_null(part)
    unread = [
        pa.array([[1], None, [2]], pa.list_(pa.int32())),
        pa.array([[1, None], [2]], pa.list_(pa.int32())),
        pa.array([[True], [False]], pa.list_(pa.bool_())),
        pa.array([[1], [2]], pa.large_list(pa.int32())),
        pa.array([["a"], ["b"]], pa.list_(pa.string())),
        pa.array([], pa.list_(pa.int32())),
    ]
    assert [from_buffers(column) for column in unread] == [None] * len(unread)
    for column in unread[:-2]:  # read through pyarrow instead, as before
        lengths, _ = list_parts(column)
        assert lengths.tolist() == pyarrows(column)[0]
    with_null = pa.array([[1], [2, None], [3]], pa.list_(pa.int32()))
    assert values_hold_null(with_null) and values_hold_null(with_null.slice(1, 1))
    assert not values_hold_null(with_null.slice(0, 1)) and not values_hold_null(with_null.slice(2))
    assert from_buffers(with_null.slice(2)) is not None  # the null lies outside the rows read
