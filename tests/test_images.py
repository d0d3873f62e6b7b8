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
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import packcli
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
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

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


def _image_messages(path: str, text: str, answer: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "image", "image": path}, {"type": "text", "text": text}]},
        {"role": "assistant", "content": answer},
    ]


def test_a_missing_image_or_a_count_mismatch_is_one_line_or_a_counted_skip(
    procs: dict[str, Path], tmp_path: Path, pack: Any
) -> None:
    make_image(tmp_path / "a.png", 64, 64)
    good = {"messages": _image_messages("a.png", "q", "a")}
    missing = {"messages": _image_messages("gone.png", "q", "a")}
    mismatch = {
        "images": ["a.png", "a.png"],
        "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "one image part"}]},
            {"role": "assistant", "content": "a"},
        ],
    }
    data = write_jsonl(tmp_path / "d.jsonl", [good, missing, mismatch])
    result = pack(data, "-o", tmp_path / "out", "--processor", procs["training"], expect=1)
    line = one_error_line(result)
    assert "d.jsonl line 2" in line and str(tmp_path / "gone.png") in line and "does not exist" in line
    result = pack(
        data,
        "-o",
        tmp_path / "out",
        "--processor",
        procs["training"],
        "--on-error",
        "skip",
        "--rejects",
        tmp_path / "rejects.jsonl",
    )
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["packed"] == 1
    assert manifest["counts"]["dropped"] == {"image_count_mismatch": 1, "image_missing": 1}
    rejects = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert [r["position"] for r in rejects] == [2, 3]
    assert "lists 2 images but its messages place 1" in rejects[1]["detail"]


def _row_images_are_whole(rows: list[dict[str, Any]], pad_id: int) -> int:
    """Check every image of the rows lies whole in its row and untrained; return how many there are."""
    n = 0
    for row in rows:
        starts = [sum(row["seq_lengths"][:j]) for j in range(len(row["seq_lengths"]))]
        for off, count, j in zip(row["image_offsets"], row["image_tokens"], row["image_sample"], strict=True):
            assert starts[j] <= off and off + count <= starts[j] + row["seq_lengths"][j]
            assert row["input_ids"][off : off + count] == [pad_id] * count
            assert row["input_ids"][off - 1] != pad_id and row["input_ids"][off + count] != pad_id
            assert set(row["labels"][off : off + count]) == {-100}
            n += 1
        assert row["input_ids"].count(pad_id) == sum(row["image_tokens"])
    return n


def test_split_pieces_carry_their_own_images(
    procs: dict[str, Path], reference: Reference, tmp_path: Path, pack: Any
) -> None:
    paths = [make_image(tmp_path / f"{k}.png", 200 + 28 * k, 150) for k in range(4)]
    messages: list[dict[str, Any]] = []
    for k, path in enumerate(paths):
        messages += _image_messages(str(path), f"question {k} " * 20, f"answer {k} " * 20)
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])
    out = tmp_path / "out"
    pack(data, "-o", out, "--processor", procs["training"], "--max-len", "300", "--overflow", "split")
    rows = _rows(out)
    assert len(rows) > 1 and all(len(row["input_ids"]) <= 300 for row in rows)
    assert _row_images_are_whole(rows, reference.pad_id) == 4
    assert sorted(ref for row in rows for ref in row["image_refs"]) == sorted(map(str, paths))


def test_truncate_that_would_cut_an_image_is_a_counted_drop(
    procs: dict[str, Path], reference: Reference, tmp_path: Path, pack: Any
) -> None:
    first = make_image(tmp_path / "first.png", 280, 280)  # 100 image tokens
    late = {  # its image begins inside the first 150 tokens and ends after them: truncation would cut it
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello " * 20},
            {
                "role": "user",
                "content": [{"type": "text", "text": "word " * 40}, {"type": "image", "image": str(first)}],
            },
            {"role": "assistant", "content": "ok"},
        ]
    }
    early = {"messages": _image_messages(str(first), "q", "answer " * 300)}  # the image stays whole
    data = write_jsonl(tmp_path / "d.jsonl", [late, early])
    out = tmp_path / "out"
    pack(data, "-o", out, "--processor", procs["training"], "--max-len", "150", "--overflow", "truncate")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["dropped"] == {"image_cut": 1}
    rows = _rows(out)
    assert [row["sample_index"] for row in rows] == [[1]]
    assert _row_images_are_whole(rows, reference.pad_id) == 1


def test_a_cache_hit_is_not_reused_once_an_image_changed(procs: dict[str, Path], tmp_path: Path) -> None:
    path = make_image(tmp_path / "a.png", 300, 200)
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": _image_messages("a.png", "q", "a")}])
    given: dict[str, Any] = {"processor": procs["training"], "num_proc": 1, "cache_dir": tmp_path / "cache"}
    first = packcli.pack(data, 1024, tmp_path / "one", **given)
    again = packcli.pack(data, 1024, tmp_path / "two", **given)
    assert (first.summary.cache, again.summary.cache) == ("miss", "hit")
    assert _rows(tmp_path / "two")[0]["image_grid"] == [[1, 14, 22]]
    make_image(path, 600, 400)
    stamp = path.stat().st_mtime + 10
    os.utime(path, (stamp, stamp))
    changed = packcli.pack(data, 1024, tmp_path / "three", **given)
    assert changed.summary.cache == "miss"
    assert any("a.png changed since the cache entry was made" in w for w in changed.summary.warnings)
    assert _rows(tmp_path / "three")[0]["image_grid"] == [[1, 28, 42]]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--engine", "ray"], "the Ray engine with images is not supported yet"),
        (["--dedup", "exact"], "--dedup exact with images is not supported yet"),
        (["--eval-records", "1"], "images are not packed with --eval-records yet"),
        (["--tokenizer", "other"], "--tokenizer names tokenizer 'other', but the processor's tokenizer"),
    ],
)
def test_what_images_are_not_packed_with_is_refused_in_one_line(
    extra: list[str], words: str, procs: dict[str, Path], tmp_path: Path, pack: Any
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": _image_messages("a.png", "q", "a")}])
    result = pack(data, "-o", tmp_path / "out", "--processor", procs["training"], *extra, expect=2)
    assert words in one_error_line(result)
    assert not (tmp_path / "out").exists()


def test_embed_images_without_a_processor_is_refused(tmp_path: Path, pack: Any) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "a b"}])
    result = pack(data, "-o", tmp_path / "out", "--embed-images", expect=2)
    assert "--embed-images applies to images, which are packed with --processor" in one_error_line(result)


def test_truncate_from_the_left_moves_the_images_offsets(
    procs: dict[str, Path], reference: Reference, tmp_path: Path, pack: Any
) -> None:
    image = make_image(tmp_path / "a.png", 280, 280)  # 100 image tokens
    tail = {  # the cut from the left keeps its image, which moves 100 or so tokens towards the row's start
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "word " * 100}, {"type": "image", "image": "a.png"}]},
            {"role": "assistant", "content": "ok " * 10},
        ]
    }
    head = {"messages": _image_messages("a.png", "q " * 100, "answer " * 10)}  # a left cut would cut its image
    data = write_jsonl(tmp_path / "d.jsonl", [tail, head])
    out = tmp_path / "out"
    args = ["--max-len", "150", "--overflow", "truncate", "--truncate-side", "left"]
    pack(data, "-o", out, "--processor", procs["training"], *args)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["dropped"] == {"image_cut": 1} and manifest["counts"]["truncated"] == 1
    rows = _rows(out)
    assert [row["sample_index"] for row in rows] == [[0]]
    assert _row_images_are_whole(rows, reference.pad_id) == 1
    assert rows[0]["image_refs"] == [str(image)]


def test_every_image_form_becomes_one_kind_of_part(tmp_path: Path) -> None:
    from packcli.errors import RecordError
    from packcli.io.uri import is_uri
    from packcli.records.formats import DEFAULT_FIELDS, normalize
    from packcli.records.images import IMAGE_KEY, attach_images, sample_images

    parts = [
        {"type": "image", "image": "a.png"},
        {"type": "image", "path": "sub/b.png"},
        {"type": "image", "url": "file:///abs/c.png"},
        {"type": "image_url", "image_url": {"url": "d.png"}},
        {"type": "image", "image": {"bytes": b"\x89PNG", "path": "ignored.png"}},
        {"type": "image"},
        {"type": "text", "text": "<image> stays text: the record's images are taken by the part above"},
    ]
    record = {"images": [{"bytes": None, "path": "e.png"}], "messages": [{"role": "user", "content": parts}]}
    sample = attach_images(normalize(record, "messages", DEFAULT_FIELDS), record, str(tmp_path), is_uri)
    assert sample_images(sample) == [
        {"path": str(tmp_path / "a.png")},
        {"path": str(tmp_path / "sub" / "b.png")},
        {"path": "/abs/c.png"},
        {"path": str(tmp_path / "d.png")},
        {"bytes": b"\x89PNG"},
        {"path": str(tmp_path / "e.png")},
    ]
    content = (sample.messages or [])[0]["content"]
    assert [p["type"] for p in content] == ["image"] * 6 + ["text"] and all(IMAGE_KEY in p for p in content[:6])
    remote = {"messages": [{"role": "user", "content": [{"type": "image", "url": "https://x/y.png"}]}]}
    with pytest.raises(RecordError, match="is not a local file; download the images"):
        attach_images(normalize(remote, "messages", DEFAULT_FIELDS), remote, str(tmp_path), is_uri)
    text_only = {"messages": [{"role": "user", "content": "an <image> without images is text"}]}
    normalised = normalize(text_only, "messages", DEFAULT_FIELDS)
    assert attach_images(normalised, text_only, str(tmp_path), is_uri) is normalised


def test_a_split_piece_whose_cut_would_cut_its_image_is_left_out_and_counted(
    procs: dict[str, Path], reference: Reference, tmp_path: Path, pack: Any
) -> None:
    make_image(tmp_path / "a.png", 280, 280)  # 100 image tokens
    messages = [
        *_image_messages("a.png", "first", "short answer"),
        # Too long on its own: split's fallback cuts it from the left, where its image is.
        *_image_messages("a.png", "word " * 200, "long answer"),
    ]
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])
    out = tmp_path / "out"
    pack(data, "-o", out, "--processor", procs["training"], "--max-len", "200", "--overflow", "split")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["dropped"] == {}
    assert manifest["counts"]["split"]["pieces_left_out"] == {"piece_image_cut": 1}
    rows = _rows(out)
    assert [(row["sample_index"], row["piece_index"]) for row in rows] == [([0], [0])]
    assert _row_images_are_whole(rows, reference.pad_id) == 1
    assert manifest["lost"]["tokens_by_reason"]["piece_image_cut"] > 200


def test_preference_records_found_with_a_processor_are_refused(
    procs: dict[str, Path], tmp_path: Path, pack: Any
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}])
    result = pack(data, "-o", tmp_path / "out", "--processor", procs["training"], expect=2)
    assert "preference data with images is not supported yet; leave out --processor" in one_error_line(result)


def test_a_presets_processor_is_read_beside_the_preset(procs: dict[str, Path], tmp_path: Path, pack: Any) -> None:
    import shutil

    (tmp_path / "conf").mkdir()
    shutil.copytree(procs["training"], tmp_path / "conf" / "proc")
    make_image(tmp_path / "a.png", 56, 56)
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": _image_messages("a.png", "q", "a")}])
    preset = tmp_path / "conf" / "preset.toml"
    preset.write_text('processor = "proc"\n')
    pack(data, "-o", tmp_path / "out", "--config", preset)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["options"]["processor"] == str(tmp_path / "conf" / "proc")
    assert _rows(tmp_path / "out")[0]["image_tokens"] == [4]


def test_the_config_keeps_no_tokenizer_and_the_run_uses_the_processors(
    procs: dict[str, Path], reference: Reference, tmp_path: Path
) -> None:
    from packcli.config import PackConfig

    directory = str(procs["training"])
    config = PackConfig(inputs=("d.jsonl",), processor=directory)
    assert config.tokenizer is None and config.tokenizer_name == directory
    make_image(tmp_path / "a.png", 56, 56)
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": _image_messages("a.png", "q", "a")}])
    given: dict[str, Any] = {"processor": directory, "num_proc": 1, "cache_dir": tmp_path / "cache"}
    result = packcli.pack(data, 1024, tmp_path / "one", **given)
    manifest = json.loads((tmp_path / "one" / "manifest.json").read_text())
    assert result.tokenizer == manifest["tokenizer"]["name"] == manifest["options"]["tokenizer"] == directory
    row = _rows(tmp_path / "one")[0]
    assert row["input_ids"].count(reference.pad_id) == row["image_tokens"][0] == 4
    # Naming the same directory as --tokenizer too (spelled otherwise) is the same run: the same cache entry
    # and the same manifest.
    again = packcli.pack(data, 1024, tmp_path / "two", tokenizer=directory + "/", **given)
    assert (result.summary.cache, again.summary.cache) == ("miss", "hit")
    assert json.loads((tmp_path / "two" / "manifest.json").read_text())["tokenizer"] == manifest["tokenizer"]
    assert again.tokenizer == directory


def test_image_offsets_count_the_samples_padding(
    procs: dict[str, Path], reference: Reference, tmp_path: Path, pack: Any
) -> None:
    for k in range(3):
        make_image(tmp_path / f"{k}.png", 56 + 28 * k, 56)
    records = [{"messages": _image_messages(f"{k}.png", f"q{k}", f"a{k}")} for k in range(3)]
    data = write_jsonl(tmp_path / "d.jsonl", records)
    out = tmp_path / "out"
    pack(data, "-o", out, "--processor", procs["training"], "--pad-to-multiple-of", "64", "--pad-to-max")
    rows = _rows(out)
    assert len(rows) == 1 and len(rows[0]["seq_lengths"]) == 4  # three samples and the row's padding
    assert _row_images_are_whole(rows, reference.pad_id) == 3
    assert rows[0]["image_sample"] == [0, 1, 2] and all(n % 64 == 0 for n in rows[0]["seq_lengths"][:3])


def test_an_image_replaced_with_the_same_size_and_mtime_is_not_a_cache_hit(
    procs: dict[str, Path], tmp_path: Path
) -> None:
    """What ``cp -p`` of another image of the same byte size does: only the inode and ctime tell."""
    path = make_image(tmp_path / "a.bmp", 600, 400)  # uncompressed: 400x600 has the very same byte size
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": _image_messages("a.bmp", "q", "a")}])
    given: dict[str, Any] = {"processor": procs["training"], "num_proc": 1, "cache_dir": tmp_path / "cache"}
    first = packcli.pack(data, 2048, tmp_path / "one", **given)
    before = path.stat()
    other = make_image(tmp_path / "b.bmp", 400, 600)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, path)
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    again = packcli.pack(data, 2048, tmp_path / "two", **given)
    assert (first.summary.cache, again.summary.cache) == ("miss", "miss")
    grids = [_rows(tmp_path / out)[0]["image_grid"] for out in ("one", "two")]
    (t, h, w) = grids[0][0]
    assert grids[1] == [[t, w, h]]  # the new image's grid, turned; not the cached one's


def test_an_image_in_an_assistant_message_is_refused_or_counted_never_trained(
    procs: dict[str, Path], tmp_path: Path, pack: Any
) -> None:
    make_image(tmp_path / "a.png", 60, 40)
    shown = {
        "messages": [
            {"role": "user", "content": "draw it"},
            {"role": "assistant", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "here"}]},
        ]
    }
    asked = {"messages": _image_messages("a.png", "q", "a")}
    data = write_jsonl(tmp_path / "d.jsonl", [asked, shown])
    line = one_error_line(pack(data, "-o", tmp_path / "out", "--processor", procs["training"], expect=1))
    assert "d.jsonl line 2: message 1 is an assistant message holding an image" in line
    pack(data, "-o", tmp_path / "out", "--processor", procs["training"], "--on-error", "skip")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["packed"] == 1 and manifest["counts"]["dropped"] == {"image_in_answer": 1}
