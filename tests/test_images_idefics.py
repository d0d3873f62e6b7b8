"""Idefics3 and SmolVLM through ``packcli pack --processor``, proved against the processor itself.

An image there becomes more than a run of image tokens (tile markers, newlines, ``<global-img>``): its
rows carry ``image_spans``, the tokens of each image's whole expansion. Idefics3Processor constructs here:
each packed sample's ids must equal its own ``apply_chat_template(messages, tokenize=True,
return_dict=True)`` for the sample alone; no token of an expansion is trained; verify and the collator
check the spans. SmolVLMProcessor does not construct here: its samples are compared with its documented
expansion (``get_image_prompt_string``), SmolVLM-Instruct's values saved as an Idefics3Processor too.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.errors import IncompatibleError
from tests.vision import make_idefics3_processor, make_smolvlm_processor

from .conftest import one_error_line
from .test_images import _rows, _samples
from .test_images_families import _corpus, _with_pil
from .test_report_images import first_with_image, rewrite_shard


def _spans(rows: list[dict[str, Any]]) -> dict[int, list[tuple[int, int]]]:
    """Each sample's images' (offset within the sample, span), by sample_index."""
    found: dict[int, list[tuple[int, int]]] = {}
    for row in rows:
        at = 0
        for j, (n, index) in enumerate(zip(row["seq_lengths"], row["sample_index"], strict=True)):
            found[index] = [
                (row["image_offsets"][i] - at, row["image_spans"][i])
                for i in range(len(row["image_sample"]))
                if row["image_sample"][i] == j
            ]
            at += n
    return found


def _check_samples(out: Path, expected: list[Any], want_ids: Any, tok: Any, seq_len: int) -> set[tuple[int, int]]:
    rows = _rows(out)
    assert any(len(row["seq_lengths"]) > 1 for row in rows)  # several samples per row
    samples, spans = _samples(rows), _spans(rows)
    assert sorted(samples) == list(range(len(expected)))
    image_id = tok.convert_tokens_to_ids("<image>")
    fake = tok.convert_tokens_to_ids("<fake_token_around_image>")
    grids = set()
    for index, (messages, images) in enumerate(expected):
        got = samples[index]
        ids = want_ids(messages)
        assert got["ids"] == ids, f"sample {index}"
        labels = got["labels"]
        assert any(label != -100 for label in labels)
        assert [label for label in labels if label != -100] == [
            t for t, lab in zip(ids, labels, strict=True) if lab != -100
        ]
        assert len(got["images"]) == len(images) == len(spans[index])
        inside = set()
        for image, (offset, span) in zip(got["images"], spans[index], strict=True):
            assert image["offset"] == offset
            part = ids[offset : offset + span]
            # The whole expansion: from its first marker to its closing one, every image token of it.
            assert part[0] == fake and part[-1] == fake
            assert part.count(image_id) == image["tokens"]
            rows_, cols = image["grid"]
            assert image["tokens"] == seq_len * (rows_ * cols + 1 if rows_ * cols else 1)
            grids.add((rows_, cols))
            assert all(label == -100 for label in labels[offset : offset + span])
            inside.update(range(offset, offset + span))
        assert all(t != image_id for i, t in enumerate(ids) if i not in inside)
        assert all(t != fake for i, t in enumerate(ids) if i not in inside)
    return grids


@pytest.mark.parametrize("split", [True, False])
def test_idefics3_samples_equal_the_processors_own_apply_chat_template(split: bool, tmp_path: Path, pack: Any) -> None:
    from transformers import Idefics3Processor

    directory = make_idefics3_processor(tmp_path / "proc", do_image_splitting=split)
    processor = Idefics3Processor.from_pretrained(str(directory))
    data, expected = _corpus(tmp_path)
    out = tmp_path / "out"
    pack(data, "-o", out, "--processor", directory, "--max-len", "16384")
    assert json.loads((out / "manifest.json").read_text())["tokenizer"]["processor"]["family"] == "idefics3"
    assert "image_spans" in pq.read_schema(next(out.glob("shard-*.parquet"))).names

    def want(messages: list[dict[str, Any]]) -> list[int]:
        got = processor.apply_chat_template(_with_pil(messages), tokenize=True, return_dict=True)
        return [int(t) for t in got["input_ids"][0]]

    grids = _check_samples(out, expected, want, processor.tokenizer, 169)
    # Split: tiles of several shapes (rows x cols and the whole image); not split: the whole image alone.
    assert len(grids) > 2 and (0, 0) not in grids if split else grids == {(0, 0)}


@pytest.mark.parametrize("saved_as", ["SmolVLMProcessor", "Idefics3Processor"])
def test_smolvlm_samples_equal_its_documented_expansion(saved_as: str, tmp_path: Path, pack: Any) -> None:
    from transformers import AutoTokenizer
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    from packcli.vision import image_size, load_processor
    from packcli.vision.images import ImageRef

    directory = make_smolvlm_processor(tmp_path / "proc", processor_class=saved_as)
    proc = load_processor(str(directory))
    tok = AutoTokenizer.from_pretrained(str(directory))
    ip = proc.image_processor
    data, expected = _corpus(tmp_path)
    out = tmp_path / "out"
    pack(data, "-o", out, "--processor", directory, "--max-len", "16384")

    def want(messages: list[dict[str, Any]]) -> list[int]:
        text = tok.apply_chat_template(messages, chat_template=proc.chat_template, tokenize=False)
        pieces = text.split("<image>")
        text = pieces[0]
        parts = [p for m in messages for p in m["content"] if p["type"] == "image"]
        for part, piece in zip(parts, pieces[1:], strict=True):
            height, width = image_size(ImageRef(path=part["image"]))
            _, rows, cols = ip.get_number_of_image_patches(height, width, {})
            text += get_image_prompt_string(
                rows,
                cols,
                81,
                fake_token_around_image="<fake_token_around_image>",
                image_token="<image>",
                global_image_token="<global-img>",
            )
            text += piece
        special = not text.startswith(tok.bos_token or "\2")
        return [int(t) for t in tok(text, add_special_tokens=special)["input_ids"]]

    assert len(_check_samples(out, expected, want, tok, 81)) > 2


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("idefics_out")
    directory = make_idefics3_processor(root / "proc")
    data, _ = _corpus(root)
    out = root / "out"
    argv = ["pack", str(data), "-o", str(out), "--processor", str(directory), "--max-len", "16384"]
    result = CliRunner().invoke(app, [*argv, "--no-cache", "--num-proc", "1"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return directory, out


def test_verify_passes_the_output_and_catches_a_moved_span(packed: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = packed
    assert CliRunner().invoke(app, ["verify", str(out)]).exit_code == 0
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)

    def move(rows: list[dict[str, Any]]) -> None:
        first_with_image(rows)["image_spans"][0] -= 1  # the span no longer holds the image's closing marker

    name = rewrite_shard(bad, move)
    result = CliRunner().invoke(app, ["verify", str(bad)])
    assert result.exit_code == 1
    line = result.stderr.splitlines()[0]
    assert line.startswith(f"{name}: 1 row has images") and "image 0" in line, line
    assert "sha256" not in result.stderr


def test_the_collator_gives_the_tiles_and_refuses_a_changed_count(packed: tuple[Path, Path]) -> None:
    from packcli.train.vision import VisionCollator

    directory, out = packed
    rows = _rows(out)
    row = next(r for r in rows if any(g != [0, 0] for g in r["image_grid"]))
    collator = VisionCollator(directory)
    batch = collator([row])
    images = len(row["image_refs"])
    assert batch["pixel_values"].shape[0] == images
    tiles = [rows_ * cols + 1 if rows_ * cols else 1 for rows_, cols in row["image_grid"]]
    assert batch["pixel_values"].shape[1] == max(tiles)
    assert batch["pixel_attention_mask"].shape[:2] == batch["pixel_values"].shape[:2]
    assert batch["input_ids"].tolist()[0] == row["input_ids"]
    changed = {**row, "image_tokens": [t + 169 for t in row["image_tokens"]]}
    with pytest.raises(IncompatibleError, match="image"):
        collator([changed])


def test_a_family_not_proven_is_still_refused(tmp_path: Path, pack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from packcli.vision.families import FAMILIES

    family = FAMILIES["Idefics3Processor"]
    monkeypatch.setitem(FAMILIES, "Idefics3Processor", dataclasses.replace(family, packs=False))
    directory = make_idefics3_processor(tmp_path / "proc")
    data, _ = _corpus(tmp_path)
    result = pack(data, "-o", tmp_path / "out", "--processor", directory, "--no-cache", expect=None)
    assert result.exit_code != 0
    assert "packcli measures idefics3 images exactly but does not pack them yet" in one_error_line(result)


def test_a_left_cut_moves_the_offset_and_keeps_the_span(tmp_path: Path, pack: Any) -> None:
    from transformers import AutoTokenizer

    from tests.vision import make_image

    directory = make_idefics3_processor(tmp_path / "proc", do_image_splitting=False)
    image = make_image(tmp_path / "a.png", 500, 300)
    content = [{"type": "text", "text": "word " * 300}, {"type": "image", "image": str(image)}]
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": "ok " * 10}]
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": messages}) + "\n")
    out = tmp_path / "out"
    pack(
        data,
        "-o",
        out,
        "--processor",
        directory,
        "--max-len",
        "300",
        "--overflow",
        "truncate",
        "--truncate-side",
        "left",
    )
    assert json.loads((out / "manifest.json").read_text())["counts"]["truncated"] == 1
    (row,) = _rows(out)
    tok = AutoTokenizer.from_pretrained(str(directory))
    fake = tok.convert_tokens_to_ids("<fake_token_around_image>")
    (offset,), (span,) = row["image_offsets"], row["image_spans"]
    part = row["input_ids"][offset : offset + span]
    assert offset < 300 - span and part[0] == part[-1] == fake and span == 169 + 3
    assert part.count(tok.convert_tokens_to_ids("<image>")) == row["image_tokens"][0] == 169
    assert CliRunner().invoke(app, ["verify", str(out)]).exit_code == 0


def test_inspect_shows_an_images_whole_expansion_as_one_piece(packed: tuple[Path, Path]) -> None:
    _, out = packed
    rows = _rows(out)
    row = first_with_image(rows)
    k = rows.index(row)
    result = CliRunner().invoke(app, ["inspect", str(out), "--row", str(k), "--no-pager"])
    assert result.exit_code == 0, result.stderr
    grid = row["image_grid"][0]
    assert f"<image 1: {grid[0]}x{grid[1]} tiles, {row['image_tokens'][0]} tokens>" in result.stdout
    # No tile marker of an image is shown as text: the whole span is the image's piece.
    assert "<fake_token_around_image>" not in result.stdout and "<global-img>" not in result.stdout
    assert "<row_1_col_1>" not in result.stdout
