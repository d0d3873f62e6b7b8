"""Every processor family through ``packcli pack --processor``, proved against the processor itself.

LlavaProcessor and LlavaNextProcessor construct here: each packed sample's ids must equal that class's own
``apply_chat_template(messages, tokenize=True, return_dict=True)`` for the sample alone (its images given
as PIL images), no image token is trained, and each image's ``image_tokens`` / ``image_grid`` are what the
processor's outputs imply (the image's run of image tokens in its ids; LLaVA-NeXT's ``image_sizes``).

Idefics3 and SmolVLM expand an image into more than a run of image tokens (tile markers, newlines); their
rows are proved in tests/test_images_idefics.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.vision import (
    make_idefics3_processor,
    make_image,
    make_llava_next_processor,
    make_llava_processor,
    make_smolvlm_processor,
)

from .conftest import write_jsonl
from .test_images import _rows, _samples

# (width, height): square, wide, tall, tiny, over a pinpoint, extreme aspects.
SIZES = [(336, 336), (500, 300), (300, 500), (40, 30), (1200, 700), (900, 100), (120, 800), (673, 337)]

MAKERS: dict[str, tuple[Callable[..., Path], str]] = {
    "llava": (make_llava_processor, "LlavaProcessor"),
    "llava_next": (make_llava_next_processor, "LlavaNextProcessor"),
}


def _corpus(root: Path) -> tuple[Path, list[tuple[list[dict[str, Any]], list[Path]]]]:
    """Conversations with one or two images of many sizes, and a text-only one, as a JSONL file."""
    (root / "img").mkdir()
    paths = [make_image(root / "img" / f"{w}x{h}.png", w, h) for w, h in SIZES]
    samples: list[tuple[list[dict[str, Any]], list[Path]]] = []
    for k, path in enumerate(paths):
        images = [path] if k % 2 else [path, paths[(k + 3) % len(paths)]]
        content: list[dict[str, Any]] = [{"type": "image", "image": str(p)} for p in images]
        content.append({"type": "text", "text": f"describe {k}"})
        samples.append(
            (
                [
                    {"role": "user", "content": content},
                    {"role": "assistant", "content": [{"type": "text", "text": f"picture {k}"}]},
                ],
                images,
            )
        )
    samples.insert(
        3,
        (
            [
                {"role": "user", "content": [{"type": "text", "text": "no picture"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "text only"}]},
            ],
            [],
        ),
    )
    data = write_jsonl(root / "chat.jsonl", [{"messages": m} for m, _ in samples])
    return data, samples


def _with_pil(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as ``apply_chat_template`` takes them: each image part holding its PIL image."""
    from PIL import Image

    out = []
    for m in messages:
        content = [
            {"type": "image", "image": Image.open(p["image"]).convert("RGB")} if p["type"] == "image" else p
            for p in m["content"]
        ]
        out.append({"role": m["role"], "content": content})
    return out


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each run of ``token`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


@pytest.mark.parametrize("family", sorted(MAKERS))
def test_each_sample_equals_the_processors_own_apply_chat_template(family: str, tmp_path: Path, pack: Any) -> None:
    import transformers

    make, cls = MAKERS[family]
    directory = make(tmp_path / "proc")
    processor = getattr(transformers, cls).from_pretrained(str(directory))
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    data, expected = _corpus(tmp_path)
    out = tmp_path / "out"
    pack(data, "-o", out, "--processor", directory, "--max-len", "8192")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["processor"]["family"] == family
    rows = _rows(out)
    assert all(len(row["input_ids"]) <= 8192 for row in rows)
    assert any(len(row["seq_lengths"]) > 1 for row in rows)  # several samples per row
    samples = _samples(rows)
    assert sorted(samples) == list(range(len(expected)))
    counts: set[int] = set()
    for index, (messages, images) in enumerate(expected):
        got = samples[index]
        want = processor.apply_chat_template(_with_pil(messages), tokenize=True, return_dict=True)
        ids = [int(t) for t in want["input_ids"][0]]
        assert got["ids"] == ids, f"sample {index}"
        labels = got["labels"]
        assert all(label == -100 for t, label in zip(ids, labels, strict=True) if t == image_id)
        assert any(label != -100 for label in labels)
        assert [label for label in labels if label != -100] == [
            t for t, lab in zip(ids, labels, strict=True) if lab != -100
        ]
        runs = _runs(ids, image_id)
        assert len(runs) == len(images) == len(got["images"])
        for k, ((start, length), image) in enumerate(zip(runs, got["images"], strict=True)):
            assert image["ref"] == str(images[k])
            assert (image["offset"], image["tokens"]) == (start, length)
            counts.add(length)
            if family == "llava_next":
                assert image["grid"] == [int(x) for x in want["image_sizes"][k]]
            else:
                assert image["grid"] == []
    if family == "llava_next":  # the count follows the image's size
        assert len(counts) > 2
    else:
        assert counts == {576}


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_a_text_only_corpus_packs_under_those_families(family: str, tmp_path: Path, pack: Any) -> None:
    make = make_idefics3_processor if family == "idefics3" else make_smolvlm_processor
    directory = make(tmp_path / "proc")
    data = write_jsonl(
        tmp_path / "text.jsonl",
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}],
    )
    pack(data, "-o", tmp_path / "out", "--processor", directory)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]["packed"] == 1
