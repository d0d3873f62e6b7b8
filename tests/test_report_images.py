"""verify, inspect and stats on an image-text output (packed with --processor)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.output.rows import file_sha256
from tests.vision import make_image, make_qwen2_vl_processor

from .conftest import write_jsonl

# (width, height) of each sample's first image; sample 1 has a second image.
SIZES = [(300, 200), (56, 90), (120, 77), (64, 64)]


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_qwen2_vl_processor(tmp_path_factory.mktemp("proc") / "proc", training_template=True)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, proc: Path) -> Path:
    """One output: four samples with images (one with two), three text-only samples, two rows."""
    root = tmp_path_factory.mktemp("images")
    records = []
    for k, (w, h) in enumerate(SIZES):
        make_image(root / f"i{k}.png", w, h)
        content: list[dict[str, Any]] = [{"type": "image", "image": f"i{k}.png"}, {"type": "text", "text": f"q {k}?"}]
        if k == 1:
            make_image(root / "j.png", 40, 50)
            content.append({"type": "image", "image": "j.png"})
        records.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": f"a {k}"}]})
    for k in range(3):
        records.append({"messages": [{"role": "user", "content": f"text {k}"}, {"role": "assistant", "content": "ok"}]})
    data = write_jsonl(root / "d.jsonl", records)
    out = root / "out"
    args = ["pack", str(data), "-o", str(out), "--processor", str(proc), "--max-len", "256", "--num-proc", "1"]
    result = CliRunner().invoke(app, [*args, "--no-cache"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return out


def invoke(*args: Any, expect: int = 0) -> Any:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == expect, (result.stdout, result.stderr, result.exception)
    return result


def rows_of(out: Path) -> list[dict[str, Any]]:
    return [r for shard in sorted(out.glob("shard-*.parquet")) for r in pq.read_table(shard).to_pylist()]


def copy_output(out: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    return copy


def rewrite_shard(out: Path, edit: Callable[[list[dict[str, Any]]], None]) -> str:
    """Rewrite the first shard with ``edit(rows)`` applied, and put its new checksum in the manifest."""
    manifest = json.loads((out / "manifest.json").read_text())
    name = manifest["shards"][0]["file"]
    table = pq.read_table(out / name)
    rows = table.to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), out / name)
    manifest["shards"][0]["sha256"] = file_sha256(out / name)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return name


def first_with_image(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["image_refs"])


def test_verify_checks_a_good_image_output(packed: Path) -> None:
    result = invoke("verify", packed)
    assert "5 images" in result.stdout and "with their images" in result.stdout
    data = json.loads(invoke("verify", packed, "--json").stdout)
    assert data["ok"] and data["images"] == sum(len(r["image_refs"]) for r in rows_of(packed))


def _count(rows: list[dict[str, Any]]) -> None:
    first_with_image(rows)["image_tokens"][0] += 4


def _offset(rows: list[dict[str, Any]]) -> None:
    row = first_with_image(rows)
    row["image_offsets"][0] = row["seq_lengths"][0] + 2  # into the row's next sample


def _trained(rows: list[dict[str, Any]]) -> None:
    row = first_with_image(rows)
    at = row["image_offsets"][0]
    row["labels"][at] = row["input_ids"][at]


def _grid(rows: list[dict[str, Any]]) -> None:
    row = first_with_image(rows)
    t, h, w = row["image_grid"][0]
    row["image_grid"][0] = [t, w, h]  # the same count, a grid the processor does not give for the size


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (_count, "of the row are not all the image token"),
        (_offset, "are not inside its sample"),
        (_trained, "its image tokens are trained"),
        (_grid, "whose token count or grid is not what the processor gives for their size"),
    ],
    ids=["count", "offset", "trained", "grid"],
)
def test_verify_catches_a_damaged_image_behind_a_valid_checksum(
    packed: Path, tmp_path: Path, edit: Callable[[list[dict[str, Any]]], None], expected: str
) -> None:
    out = copy_output(packed, tmp_path)
    name = rewrite_shard(out, edit)
    result = invoke("verify", out, expect=1)
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"{name}: 1 row has images") and "(first: row 0: sample 0" in lines[0], lines
    assert expected in lines[0]
    assert "sha256" not in result.stderr


def count_one_more(out: Path, key: str) -> int:
    """Raise the manifest's image count ``key`` by one; return the count the shards hold."""
    manifest = json.loads((out / "manifest.json").read_text())
    held: int = manifest["tokenizer"]["processor"]["images"][key]
    manifest["tokenizer"]["processor"]["images"][key] = held + 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    return held


def test_verify_counts_the_manifests_image_tokens_against_the_shards(packed: Path, tmp_path: Path) -> None:
    out = copy_output(packed, tmp_path)
    held = count_one_more(out, "image_tokens")
    result = invoke("verify", out, expect=1)
    assert f"manifest.json: counts {held + 1} image tokens, the shards hold {held}" in result.stderr.splitlines()


@pytest.fixture(scope="module", params=["drop", "truncate"])
def cut(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, proc: Path) -> Path:
    """An output of three samples with images, one of them longer than --max-len: dropped, or truncated
    (its image, at its start, kept whole)."""
    root = tmp_path_factory.mktemp("cut")
    make_image(root / "a.png", 56, 56)  # 4 image tokens
    make_image(root / "b.png", 84, 56)  # 6
    records = []
    for k, (images, answer) in enumerate([(["a.png"], "ok"), (["a.png"], "word " * 200), (["a.png", "b.png"], "ok")]):
        content: list[dict[str, Any]] = [{"type": "image", "image": name} for name in images]
        content.append({"type": "text", "text": f"q {k}?"})
        records.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]})
    data = write_jsonl(root / "d.jsonl", records)
    out = root / "out"
    invoke("pack", data, "-o", out, "--processor", proc, "--max-len", "150", "--overflow", request.param, "--no-cache")
    return out


def test_the_manifests_image_counts_are_those_of_the_rows_written(cut: Path) -> None:
    manifest = json.loads((cut / "manifest.json").read_text())
    rows = rows_of(cut)
    if manifest["options"]["overflow"] == "drop":
        assert manifest["counts"]["dropped"] == {"too_long": 1}
    else:
        assert manifest["counts"]["truncated"] == 1
    held = {
        "samples": sum(len(set(r["image_sample"])) for r in rows),
        "images": sum(len(r["image_refs"]) for r in rows),
        "image_tokens": sum(sum(r["image_tokens"]) for r in rows),
        "embedded": 0,
    }
    assert held["images"] == (3 if manifest["options"]["overflow"] == "drop" else 4)
    assert manifest["tokenizer"]["processor"]["images"] == held
    assert json.loads(invoke("verify", cut, "--json").stdout)["ok"]


def test_verify_compares_the_image_counts_after_a_drop_or_a_truncation(cut: Path, tmp_path: Path) -> None:
    out = copy_output(cut, tmp_path)
    held = count_one_more(out, "images")
    result = invoke("verify", out, expect=1)
    assert f"manifest.json: counts {held + 1} images, the shards hold {held}" in result.stderr.splitlines()


def test_verify_catches_an_image_file_replaced_by_one_of_another_size(packed: Path, tmp_path: Path) -> None:
    out = copy_output(packed, tmp_path)
    image = Path(first_with_image(rows_of(out))["image_refs"][0])
    saved = image.read_bytes()
    try:
        make_image(image, 400, 100)
        result = invoke("verify", out, expect=1)
    finally:
        image.write_bytes(saved)
    line = result.stderr.splitlines()[0]
    assert "has another size now than when packed" in line and "is 400x100 now" in line


def test_verify_without_the_processor_directory_says_so_and_checks_the_rest(packed: Path, tmp_path: Path) -> None:
    out = copy_output(packed, tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["processor"]["dir"] = str(tmp_path / "gone")
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = invoke("verify", out, expect=1)
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"manifest.json: tokenizer.processor: cannot load processor '{tmp_path / 'gone'}'")
    assert "not checked against its rule" in lines[0] and len(lines) == 2  # the problem and the total
    assert "Traceback" not in result.stderr
    name = rewrite_shard(out, _trained)  # the other image checks still run
    assert any(x.startswith(f"{name}: 1 row has images") for x in invoke("verify", out, expect=1).stderr.splitlines())


def test_inspect_shows_each_image_as_one_piece(packed: Path) -> None:
    rows = rows_of(packed)
    row = first_with_image(rows)
    k = rows.index(row)
    result = invoke("inspect", packed, "--row", k, "--no-pager")
    grid = row["image_grid"][0]
    label = f"<image 1: {grid[1]}x{grid[2]} patches, {row['image_tokens'][0]} tokens>"
    assert label in result.stdout
    assert "<|image_pad|>" not in result.stdout
    n = len(row["image_refs"])
    assert result.stdout.count("<image ") == n and f"<image {n}: " in result.stdout


def test_inspect_json_gives_each_segments_images(packed: Path) -> None:
    rows = rows_of(packed)
    for k, row in enumerate(rows):
        data = json.loads(invoke("inspect", packed, "--row", k, "--json").stdout)
        want = [
            {
                "image": j + 1,
                "ref": row["image_refs"][j],
                "size": row["image_sizes"][j],
                "grid": row["image_grid"][j],
                "tokens": row["image_tokens"][j],
                "offset": row["image_offsets"][j],
            }
            for j in range(len(row["image_refs"]))
        ]
        got = [im | {"sample": s} for s, seg in enumerate(data["segments"]) for im in seg["images"]]
        assert [{k: v for k, v in im.items() if k != "sample"} for im in got] == want
        assert [im["sample"] for im in got] == row["image_sample"]
        pieces = [p for seg in data["segments"] for p in seg["pieces"] if "image" in p]
        assert [(p["image"], p["tokens"], p["trained"]) for p in pieces] == [
            (j + 1, row["image_tokens"][j], False) for j in range(len(row["image_refs"]))
        ]


def test_stats_counts_the_images_the_rows_hold(packed: Path) -> None:
    rows = rows_of(packed)
    data = json.loads(invoke("stats", packed, "--json").stdout)
    per_row = [len(r["image_refs"]) for r in rows]
    image_tokens = sum(sum(r["image_tokens"]) for r in rows)
    tokens = sum(len(r["input_ids"]) for r in rows)
    assert data["images"] == {
        "images": sum(per_row),
        "samples": sum(len(set(r["image_sample"])) for r in rows),
        "image_tokens": image_tokens,
        "image_token_share": round(image_tokens / tokens, 6),
        "per_row": {"max": max(per_row), "mean": round(sum(per_row) / len(rows), 3)},
        "embedded": sum(ref is None for r in rows for ref in r["image_refs"]),
        "referenced": sum(ref is not None for r in rows for ref in r["image_refs"]),
    }
    assert data["images"]["images"] == len(SIZES) + 1 and data["images"]["referenced"] == len(SIZES) + 1
    text = invoke("stats", packed).stdout
    assert f"{image_tokens} ({image_tokens / tokens:.1%} of tokens)" in text


@pytest.mark.parametrize(
    ("grid", "family", "words"),
    [
        ((1, 28, 40), "qwen2_vl", "28x40 patches"),
        ((2, 28, 40), "qwen2_vl", "2x28x40 patches"),
        ((2, 3), "idefics3", "2x3 tiles"),
        ((480, 640), "llava_next", "640x480 pixels"),
        ((480, 640), None, "640x480 pixels"),
        ((), "llava", "640x480 pixels"),
    ],
)
def test_grid_words_name_each_familys_grid(grid: tuple[int, ...], family: str | None, words: str) -> None:
    from packcli.report.images import grid_words

    assert grid_words(grid, (480, 640), family) == words


def test_embedded_images_are_counted_and_their_bytes_checked(packed: Path, tmp_path: Path, pack: Any) -> None:
    manifest = json.loads((packed / "manifest.json").read_text())
    image = make_image(tmp_path / "a.png", 300, 200)
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "q"}]},
        {"role": "assistant", "content": "a"},
    ]
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}] * 2)
    out = tmp_path / "embedded"
    pack(data, "-o", out, "--processor", manifest["tokenizer"]["processor"]["dir"], "--embed-images")
    stats = json.loads(invoke("stats", out, "--json").stdout)["images"]
    assert (stats["images"], stats["embedded"], stats["referenced"]) == (2, 2, 0)
    invoke("verify", out)
    other = make_image(tmp_path / "b.png", 100, 400).read_bytes()

    def replace_bytes(rows: list[dict[str, Any]]) -> None:
        first_with_image(rows)["image_bytes"][0] = other

    image.unlink()  # the bytes in the row are what is read, not the file
    name = rewrite_shard(out, replace_bytes)
    line = invoke("verify", out, expect=1).stderr.splitlines()[0]
    assert line.startswith(f"{name}: 1 row has images whose file has another size now") and "is 100x400 now" in line


def test_verify_catches_an_image_token_in_a_row_without_images(packed: Path, tmp_path: Path) -> None:
    out = copy_output(packed, tmp_path)
    token = json.loads((out / "manifest.json").read_text())["tokenizer"]["processor"]["image_token_id"]
    rows = rows_of(out)
    k = next(i for i, r in enumerate(rows) if not r["image_refs"])

    def stray(rows: list[dict[str, Any]]) -> None:
        rows[k]["input_ids"][1] = token  # a masked token: labels stay -100

    name = rewrite_shard(out, stray)
    lines = invoke("verify", out, expect=1).stderr.splitlines()
    assert lines[0] == f"{name}: 1 row has image tokens but no images (first: row {k})"


def test_a_relative_processor_is_recorded_so_that_verify_runs_from_anywhere(
    proc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_image(tmp_path / "i.png", 60, 40)
    content = [{"type": "image", "image": "i.png"}, {"type": "text", "text": "what is it?"}]
    write_jsonl(
        tmp_path / "d.jsonl",
        [{"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "a"}]}],
    )
    monkeypatch.chdir(proc.parent)
    invoke(
        "pack", tmp_path / "d.jsonl", "-o", tmp_path / "out", "--processor", proc.name, "--no-cache", "--num-proc", 1
    )
    recorded = json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"]["processor"]
    assert recorded["dir"] == str(proc.resolve())
    monkeypatch.chdir(tmp_path)
    invoke("verify", tmp_path / "out")


def test_verify_names_a_processor_other_than_the_one_that_packed(packed: Path, tmp_path: Path) -> None:
    out = copy_output(packed, tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["processor"]["sha256"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    line = invoke("verify", out, expect=1).stderr.splitlines()[0]
    assert "is not the one the output was packed with (its sha256 differs)" in line
