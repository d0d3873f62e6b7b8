"""Images packed with a processor (--processor): exact ids and labels, the image columns, the rules.

The reference of a sample's ids is what ``Qwen2VLProcessor`` gives (that class cannot be built here: it
needs torchvision): the tokenizer's ``apply_chat_template(tokenize=False)`` rendering, each
``<|image_pad|>`` expanded to ``image_grid_thw.prod() // merge_size**2`` copies (the image processor run
on the real pixels), then ``tokenizer(text)``. Labels are the training template's assistant masks, and
never on an image token.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.vision import make_image, make_qwen2_vl_processor

from .conftest import one_error_line, write_jsonl

IMAGE_COLUMNS = ["image_refs", "image_sizes", "image_grid", "image_tokens", "image_offsets", "image_sample"]
BASE_COLUMNS = ["input_ids", "labels", "position_ids", "seq_lengths", "sample_index", "piece_index"]
SIZES = [(28, 28), (300, 200), (200, 300), (640, 480), (1000, 30), (56, 900), (120, 77), (333, 222)]


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("procs")
    return {
        "template": make_qwen2_vl_processor(root / "plain"),
        "training": make_qwen2_vl_processor(root / "training", training_template=True),
    }


@pytest.fixture(scope="module")
def reference(procs: dict[str, Path]) -> Any:
    from transformers import AutoImageProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(procs["training"]))
    ip = AutoImageProcessor.from_pretrained(str(procs["training"]), backend="pil")
    return Reference(tok, ip)


class Reference:
    """What Qwen2VLProcessor.apply_chat_template(tokenize=True) gives, built from its parts."""

    def __init__(self, tok: Any, ip: Any) -> None:
        self.tok, self.ip = tok, ip
        self.pad_id = tok.convert_tokens_to_ids("<|image_pad|>")

    def count(self, image: bytes | str) -> tuple[int, list[int]]:
        import io

        from PIL import Image

        with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as im:
            grid = [int(x) for x in self.ip(images=[im.convert("RGB")])["image_grid_thw"][0]]
        return grid[0] * grid[1] * grid[2] // self.ip.merge_size**2, grid

    def encode(self, messages: list[dict[str, Any]], images: list[bytes | str]) -> tuple[list[int], list[int]]:
        """Return the processor's ids, and the assistant mask on them (image tokens: 0)."""
        text = self.tok.apply_chat_template(messages, tokenize=False)
        out = self.tok.apply_chat_template(messages, return_assistant_tokens_mask=True, return_dict=True)
        counts = [self.count(im)[0] for im in images]
        pieces = text.split("<|image_pad|>")
        assert len(pieces) == len(images) + 1
        expanded = pieces[0] + "".join("<|image_pad|>" * n + p for n, p in zip(counts, pieces[1:], strict=True))
        ids = self.tok(expanded)["input_ids"]
        # The mask of the unexpanded tokens, each image token repeated as it is expanded (never trained).
        mask: list[int] = []
        k = 0
        for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True):
            if t == self.pad_id:
                mask.extend([0] * counts[k])
                k += 1
            else:
                mask.append(m)
        return ids, mask


def _rows(out: Path) -> list[dict[str, Any]]:
    manifest = json.loads((out / "manifest.json").read_text())
    rows: list[dict[str, Any]] = []
    for shard in manifest["shards"]:
        rows.extend(pq.read_table(out / shard["file"]).to_pylist())
    return rows


def _samples(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each sample of the rows by its sample_index: its ids, labels and images (offsets within it)."""
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        at = 0
        for j, (n, index) in enumerate(zip(row["seq_lengths"], row["sample_index"], strict=True)):
            images = [
                {
                    "ref": row["image_refs"][i],
                    "size": row["image_sizes"][i],
                    "grid": row["image_grid"][i],
                    "tokens": row["image_tokens"][i],
                    "offset": row["image_offsets"][i] - at,
                    "bytes": row["image_bytes"][i] if "image_bytes" in row else None,
                }
                for i in range(len(row["image_sample"]))
                if row["image_sample"][i] == j
            ]
            found[index] = {
                "ids": row["input_ids"][at : at + n],
                "labels": row["labels"][at : at + n],
                "images": images,
            }
            at += n
    return found


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the processor's template takes them: image parts as {"type": "image"}."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": "image"} if p.get("type") in ("image", "image_url") else p for p in content]
        out.append({"role": m["role"], "content": content})
    return out


@functools.cache
def _text_encoder(template_dir: str) -> Any:
    from packcli.tokenize.encoder import EncodeOptions, Encoder

    return Encoder(template_dir, None, EncodeOptions())


def _text_mask(ref: Reference, template_dir: Path, messages: list[dict[str, Any]], images: list[Any]) -> list[int]:
    """The labels packcli's text path gives the conversation with each image written out as its tokens' text.

    For a template without generation blocks, "the assistant masks as for text" are packcli's located answers.
    """
    from packcli.records.formats import Sample

    encoder = _text_encoder(str(template_dir))
    counts = iter([ref.count(im)[0] for im in images])
    written = []
    for m in _plain(messages):
        content = m["content"]
        if isinstance(content, list):
            content = [
                {"type": "text", "text": "<|vision_start|>" + "<|image_pad|>" * next(counts) + "<|vision_end|>"}
                if p["type"] == "image"
                else p
                for p in content
            ]
        written.append({"role": m["role"], "content": content})
    result = encoder.encode_batch([Sample("chat", messages=written)])[0]
    assert isinstance(result, tuple)
    return [int(label != -100) for label in result[1]]


def _check_sample(
    ref: Reference,
    got: dict[str, Any],
    messages: list[dict[str, Any]],
    images: list[Any],
    template_dir: Path | None = None,
) -> None:
    ids, mask = ref.encode(_plain(messages), images)
    assert got["ids"] == ids
    if template_dir is not None:  # a template without generation blocks: packcli's text rule
        mask = _text_mask(ref, template_dir, messages, images)
    trained = [int(label != -100) for label in got["labels"]]
    assert trained[1:] == mask[1:] and trained[0] == 0
    assert [label for label in got["labels"] if label != -100] == [i for i, t in zip(ids, trained, strict=True) if t]
    assert len(got["images"]) == len(images)
    for image, source in zip(got["images"], images, strict=True):
        count, grid = ref.count(source)
        assert image["tokens"] == count and image["grid"] == grid
        span = got["ids"][image["offset"] : image["offset"] + count]
        assert span == [ref.pad_id] * count
        assert got["ids"][image["offset"] - 1] != ref.pad_id
        assert all(label == -100 for label in got["labels"][image["offset"] : image["offset"] + count])


def _corpus(root: Path) -> tuple[Path, Path, dict[int, tuple[list[dict[str, Any]], list[str]]]]:
    """A messages file (parts with paths, the HF convention, text only) and a ShareGPT file (<image>)."""
    (root / "img").mkdir()
    paths = [make_image(root / "img" / f"{w}x{h}.png", w, h) for w, h in SIZES]
    rel = [f"img/{p.name}" for p in paths]
    records: list[dict[str, Any]] = []
    expected: dict[int, tuple[list[dict[str, Any]], list[str]]] = {}
    for k in range(len(paths)):
        a, b = k, (k + 3) % len(paths)
        if k % 3 == 0:  # parts holding the image, one relative and one absolute
            messages = [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": rel[a]}, {"type": "text", "text": f"what {k}?"}],
                },
                {"role": "assistant", "content": f"answer {k}"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "and"}, {"type": "image", "path": str(paths[b])}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": f"second {k}"}]},
            ]
            records.append({"messages": messages})
            expected[len(records) - 1] = (messages, [str(paths[a]), str(paths[b])])
        elif k % 3 == 1:  # the Hugging Face convention
            messages = [
                {"role": "user", "content": [{"type": "text", "text": f"look {k}"}, {"type": "image"}]},
                {"role": "assistant", "content": [{"type": "text", "text": f"seen {k}"}]},
            ]
            records.append({"images": [rel[a]], "messages": messages})
            expected[len(records) - 1] = (messages, [str(paths[a])])
        else:  # text only, mixed in
            messages = [{"role": "user", "content": f"plain {k}"}, {"role": "assistant", "content": f"text {k}"}]
            records.append({"messages": messages})
            expected[len(records) - 1] = (messages, [])
    chat = write_jsonl(root / "chat.jsonl", records)
    first = len(records)
    share = []
    for k in range(3):
        a, b = k, k + 4
        share.append(
            {
                "images": [rel[a], rel[b]],
                "conversations": [
                    {"from": "human", "value": f"<image>\nCompare with <image> please {k}"},
                    {"from": "gpt", "value": f"They differ {k}."},
                ],
            }
        )
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image"},
                    {"type": "text", "text": "\nCompare with "},
                    {"type": "image"},
                    {"type": "text", "text": f" please {k}"},
                ],
            },
            {"role": "assistant", "content": f"They differ {k}."},
        ]
        expected[first + k] = (messages, [str(paths[a]), str(paths[b])])
    sharegpt = write_jsonl(root / "sharegpt.jsonl", share)
    return chat, sharegpt, expected


@pytest.mark.parametrize("which", ["template", "training"])
def test_ids_labels_and_image_columns_equal_the_processor(
    which: str, procs: dict[str, Path], reference: Reference, tmp_path: Path, pack: Any
) -> None:
    chat, sharegpt, expected = _corpus(tmp_path)
    out = tmp_path / "out"
    pack(chat, sharegpt, "-o", out, "--processor", procs[which], "--max-len", "2048")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["columns"] == BASE_COLUMNS + IMAGE_COLUMNS
    rows = _rows(out)
    assert set(rows[0]) == set(BASE_COLUMNS + IMAGE_COLUMNS)
    assert all(len(row["input_ids"]) <= 2048 for row in rows)
    samples = _samples(rows)
    assert sorted(samples) == sorted(expected)
    for index, (messages, images) in expected.items():
        _check_sample(reference, samples[index], messages, images, procs[which] if which == "template" else None)
        assert [im["ref"] for im in samples[index]["images"]] == images
    processor = manifest["tokenizer"]["processor"]
    assert processor["family"] == "qwen2_vl" and processor["image_token"] == "<|image_pad|>"
    assert processor["image_token_id"] == reference.pad_id and len(processor["sha256"]) == 64
    n_images = sum(len(images) for _, images in expected.values())
    assert processor["images"]["images"] == n_images
    assert processor["images"]["samples"] == sum(1 for _, images in expected.values() if images)
    assert manifest["counts"]["packed"] == len(expected)


def test_image_bytes_from_a_parquet_column(
    procs: dict[str, Path], reference: Reference, tmp_path: Path, pack: Any
) -> None:
    images = [make_image(tmp_path / f"{w}.png", w, h).read_bytes() for w, h in SIZES[:4]]
    messages = [
        [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"q{k}"}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"a{k}"}]},
        ]
        for k in range(4)
    ]
    table = pa.table(
        {
            "messages": [json.dumps(m) for m in messages],
            "images": [[{"bytes": data, "path": None}] for data in images],
        }
    )
    data = tmp_path / "data.parquet"
    pq.write_table(table, data)
    pack(data, "-o", tmp_path / "out", "--processor", procs["training"], "--max-len", "1024")
    rows = _rows(tmp_path / "out")
    assert "image_bytes" in rows[0]
    samples = _samples(rows)
    for k in range(4):
        _check_sample(reference, samples[k], messages[k], [images[k]])
        assert samples[k]["images"][0]["ref"] is None and samples[k]["images"][0]["bytes"] == images[k]


def test_embed_images_writes_the_files_bytes(procs: dict[str, Path], tmp_path: Path, pack: Any) -> None:
    path = make_image(tmp_path / "a.png", 300, 200)
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "q"}]},
        {"role": "assistant", "content": "a"},
    ]
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])
    pack(data, "-o", tmp_path / "plain", "--processor", procs["training"])
    assert "image_bytes" not in _rows(tmp_path / "plain")[0]
    pack(data, "-o", tmp_path / "embedded", "--processor", procs["training"], "--embed-images")
    row = _rows(tmp_path / "embedded")[0]
    assert row["image_bytes"] == [path.read_bytes()] and row["image_refs"] == [str(path)]


def test_without_a_processor_an_image_part_is_refused_naming_the_option(tmp_path: Path, pack: Any) -> None:
    make_image(tmp_path / "a.png", 30, 30)
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "q"}]},
        {"role": "assistant", "content": "a"},
    ]
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])
    result = pack(data, "-o", tmp_path / "out", expect=1)
    assert "pass --processor DIR to pack images" in one_error_line(result)
