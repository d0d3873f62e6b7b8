"""Training on packed image-text rows: mRoPE positions, the vision collator, loss parity, the recipe.

The samples are rendered with the Qwen2.5-VL processor's chat template and their image placeholders
expanded with ``load_processor(...).measure(...)``, as the packing side does; rows are packed by hand
following the row schema (``packcli.train.vision``). The property that matters: a sample in a packed row
gets exactly the loss it gets alone (where the model computes its own positions with ``get_rope_index``),
and a different one when the positions are not restarted per sample.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from packcli.contract import IGNORE_INDEX
from packcli.errors import IncompatibleError, InputError
from packcli.train.collate import PackedCollator
from packcli.train.mrope import mrope_positions
from packcli.train.vision import VisionCollator
from packcli.vision import ImageRef, ImageTokens, VisionProcessor, image_size, load_processor
from tests.vision import make_image, make_qwen2_vl_processor

ROOT = Path(__file__).resolve().parents[1]
REL_TOL = 1e-5  # packed vs alone, relative (as tests/test_trainer.py)
LEAK = 1e-3  # a sample that attends to another sample's tokens moves its loss by more than this (relative)
MODELS = [("qwen2_5_vl", "sdpa"), ("qwen2_5_vl", "eager"), ("qwen2_vl", "sdpa")]

Stats = tuple[float, int]  # (sum of the token losses, number of trained tokens)


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"packcli_example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECIPE = _example("train_vision")


# -- samples and rows, as the packing side makes them ------------------------------------------------


@dataclasses.dataclass
class Sample:
    """One tokenized sample: ids, unshifted labels (image tokens untrained), its images in order."""

    ids: list[int]
    labels: list[int]
    paths: list[str]
    sizes: list[tuple[int, int]]
    measured: list[ImageTokens]
    offsets: list[int]  # where each image's tokens start in the sample


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_qwen2_vl_processor(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def proc(qwen_dir: Path) -> VisionProcessor:
    return load_processor(str(qwen_dir))


@pytest.fixture(scope="module")
def tokenizer(qwen_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_dir))


@pytest.fixture(scope="module")
def image_token_id(tokenizer: Any) -> int:
    return int(tokenizer.convert_tokens_to_ids("<|image_pad|>"))


def _render(proc: VisionProcessor, tokenizer: Any, messages: list[dict[str, Any]], paths: list[Path]) -> Sample:
    """Render with the processor's template, expand each placeholder to its measured tokens, tokenize."""
    sizes = [image_size(ImageRef(path=str(p))) for p in paths]
    measured = [proc.measure(*size) for size in sizes]

    def tokens(text: str) -> list[int]:
        parts = text.split(proc.image_token)
        assert len(parts) == len(measured) + 1
        expanded = parts[0] + "".join(m.text + part for m, part in zip(measured, parts[1:], strict=True))
        return list(tokenizer(expanded, add_special_tokens=False)["input_ids"])

    template = proc.chat_template
    full = tokens(tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False))
    prompt = tokens(
        tokenizer.apply_chat_template(messages[:-1], chat_template=template, tokenize=False, add_generation_prompt=True)
    )
    assert full[: len(prompt)] == prompt
    labels = [IGNORE_INDEX] * len(prompt) + full[len(prompt) :]  # the last answer is trained
    image_id = int(tokenizer.convert_tokens_to_ids(proc.image_token))
    is_image = np.asarray(full) == image_id
    offsets = np.flatnonzero(is_image & ~np.concatenate(([False], is_image[:-1]))).tolist()
    return Sample(full, labels, [str(p) for p in paths], sizes, measured, offsets)


def _user(*parts: str) -> dict[str, Any]:
    content = [{"type": "image"} if p == "<image>" else {"type": "text", "text": p} for p in parts]
    return {"role": "user", "content": content}


def _answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


Case = tuple[list[dict[str, Any]], list[Path]]  # a conversation (image parts {"type": "image"}) and its images


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    """Five conversations: 0, 1 and 2 images, text before, between and after them, images of different sizes."""
    d = tmp_path_factory.mktemp("images")

    def image(width: int, height: int, **kw: Any) -> Path:
        suffix = "jpg" if kw else "png"
        return make_image(d / f"{width}x{height}.{suffix}", width, height, **kw)

    turned = image(90, 60, exif_orientation=6)  # the processor sees it 60 wide, 90 high
    return [
        ([_user("<image>", "What is in the picture?"), _answer("A cat on a mat, sleeping.")], [image(56, 84)]),
        ([{"role": "user", "content": "Say hello in French."}, _answer("Bonjour tout le monde.")], []),
        (
            [_user("Compare", "<image>", "with", "<image>", "please."), _answer("The first is wider than the second.")],
            [image(140, 56), image(30, 200)],
        ),
        (
            [_user("<image>", "<image>", "Two in a row."), _answer("Yes, two images side by side.")],
            [image(100, 100), image(84, 112)],
        ),
        (
            [
                _user("<image>", "Describe it."),
                _answer("Noise."),
                _user("And this one?", "<image>"),
                _answer("More noise, taller."),
            ],
            [turned, image(70, 70)],
        ),
    ]


@pytest.fixture(scope="module")
def samples(proc: VisionProcessor, tokenizer: Any, cases: list[Case]) -> list[Sample]:
    """The five conversations rendered and expanded."""
    built = [_render(proc, tokenizer, messages, paths) for messages, paths in cases]
    counts = [m.count for s in built for m in s.measured]
    assert len(set(counts)) >= 5, f"the images should differ in size: {counts}"
    assert built[4].sizes[0] == (90, 60)
    return built


def _pack(samples: list[Sample], indices: list[int], *, embed: bool = False) -> dict[str, Any]:
    """Pack samples into one row by hand, following the row schema."""
    row: dict[str, Any] = {k: [] for k in ("input_ids", "labels", "position_ids", "seq_lengths", "sample_index")}
    images: dict[str, list[Any]] = {
        k: [] for k in ("image_refs", "image_sizes", "image_grid", "image_tokens", "image_offsets", "image_sample")
    }
    data: list[bytes | None] = []
    for s, (sample, index) in enumerate(zip(samples, indices, strict=True)):
        base = len(row["input_ids"])
        row["input_ids"] += sample.ids
        row["labels"] += [IGNORE_INDEX, *sample.labels[1:]]  # a sample's first token is never trained
        row["position_ids"] += list(range(len(sample.ids)))
        row["seq_lengths"].append(len(sample.ids))
        row["sample_index"].append(index)
        for path, size, measured, offset in zip(
            sample.paths, sample.sizes, sample.measured, sample.offsets, strict=True
        ):
            images["image_refs"].append(path)
            images["image_sizes"].append(list(size))
            images["image_grid"].append(list(measured.grid))
            images["image_tokens"].append(measured.count)
            images["image_offsets"].append(base + offset)
            images["image_sample"].append(s)
            data.append(Path(path).read_bytes() if embed else None)
    row |= images
    if embed:
        row["image_bytes"] = data
    return row


@pytest.fixture(scope="module")
def rows(samples: list[Sample]) -> list[dict[str, Any]]:
    return [_pack(samples[:3], [0, 1, 2]), _pack(samples[3:], [3, 4])]


# -- 1. mRoPE positions equal the model's get_rope_index on each sample alone -------------------------


def _random_sample(
    rng: np.random.Generator, image_id: int, start_id: int, end_id: int
) -> tuple[list[int], list[list[int]]]:
    """Text and images in any order: 0 to 4 images, grids of many shapes, text before, between and after."""
    ids: list[int] = list(rng.integers(10, 1000, rng.integers(0, 6)))
    grids: list[list[int]] = []
    for _ in range(int(rng.choice([0, 1, 1, 2, 3, 4]))):
        if grids and (not ids or ids[-1] == image_id):
            ids.append(int(rng.integers(10, 1000)))  # the model tells images apart by the text between them
        grid = [int(rng.choice([1, 1, 1, 2])), 2 * int(rng.integers(1, 9)), 2 * int(rng.integers(1, 9))]
        wrapped = bool(rng.random() < 0.8)  # the template's <|vision_start|> ... <|vision_end|>
        ids += [start_id] * wrapped + [image_id] * (grid[0] * grid[1] * grid[2] // 4) + [end_id] * wrapped
        ids += list(rng.integers(10, 1000, rng.integers(0, 4)))
        grids.append(grid)
    if not ids:
        ids = [11]
    return [int(x) for x in ids], grids


def _qwen3_vl(qwen_dir: Path) -> Any:
    """A tiny Qwen3-VL (only its get_rope_index is used), with the Qwen2.5-VL processor's token ids."""
    from transformers import Qwen3VLConfig, Qwen3VLModel

    ids = RECIPE.tiny_model(qwen_dir).config
    text = {"vocab_size": 1000, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    text |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    text |= {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True}}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32}
    vision |= {"patch_size": 16, "spatial_merge_size": 2, "deepstack_visual_indexes": [0]}
    tokens = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **{k: getattr(ids, k) for k in tokens})
    return Qwen3VLModel(config)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_mrope_positions_equal_get_rope_index_on_each_sample_alone(family: str, qwen_dir: Path) -> None:
    model = _qwen3_vl(qwen_dir) if family == "qwen3_vl" else RECIPE.tiny_model(qwen_dir, family=family).model
    config = model.config
    assert config.vision_config.spatial_merge_size == 2
    rng = np.random.default_rng(7)
    cases = [
        _random_sample(rng, config.image_token_id, config.vision_start_token_id, config.vision_end_token_id)
        for _ in range(300)
    ]
    assert sum(len(g) == 0 for _, g in cases) > 20 and sum(len(g) >= 3 for _, g in cases) > 20
    assert any(g[0] == 2 for _, grids in cases for g in grids)
    alone = []
    for ids, grids in cases:
        tensor = torch.tensor(ids)[None]
        expected, _ = model.get_rope_index(
            tensor,
            mm_token_type_ids=(tensor == config.image_token_id).int(),
            image_grid_thw=torch.tensor(grids) if grids else None,
        )
        got = mrope_positions(ids, [len(ids)], grids, image_token_id=config.image_token_id, spatial_merge_size=2)
        assert got.shape == (3, len(ids)) and got.dtype == np.int64
        np.testing.assert_array_equal(got, expected[:, 0].numpy())
        alone.append(got)
    # Packed: the row's positions are each sample's alone, back to back, restarting at 0.
    start = 0
    while start < len(cases):
        group = cases[start : start + int(rng.integers(1, 6))]
        row_ids = [t for ids, _ in group for t in ids]
        row_grids = [g for _, grids in group for g in grids]
        got = mrope_positions(
            row_ids,
            [len(ids) for ids, _ in group],
            row_grids,
            image_token_id=config.image_token_id,
            spatial_merge_size=2,
        )
        np.testing.assert_array_equal(got, np.concatenate(alone[start : start + len(group)], axis=1))
        start += len(group)


def test_mrope_positions_of_images_back_to_back_and_bad_rows() -> None:
    # Two images with no token between them are told apart by their counts: the second starts where the
    # first one's text would continue.
    got = mrope_positions([5, 9, 9, 9, 7], [5], [[1, 2, 4], [1, 2, 2]], image_token_id=9, spatial_merge_size=2)
    # image 0: 1x1x2 merged patches from position 1; image 1: one merged patch at 1 + max(1, 2) = 3.
    assert got.tolist() == [[0, 1, 1, 3, 4], [0, 1, 1, 3, 4], [0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match=r"sample 0 of the row: image 0 .* needs 4 image tokens, its run has 3"):
        mrope_positions([5, 9, 9, 9, 7], [5], [[1, 4, 4]], image_token_id=9, spatial_merge_size=2)
    with pytest.raises(ValueError, match="more image tokens than the row's 0 images"):
        mrope_positions([5, 9], [2], [], image_token_id=9, spatial_merge_size=2)
    with pytest.raises(ValueError, match="the row has 2 images but image tokens for 1"):
        mrope_positions([5, 9, 7], [3], [[1, 2, 2], [1, 2, 2]], image_token_id=9, spatial_merge_size=2)
    with pytest.raises(ValueError, match="seq_lengths"):
        mrope_positions([5, 9, 7], [2], [[1, 2, 2]], image_token_id=9, spatial_merge_size=2)
    with pytest.raises(ValueError, match=r"grid \[1, 3, 2\] is not a whole number of 2x2 merges"):
        mrope_positions([5, 9, 7], [3], [[1, 3, 2]], image_token_id=9, spatial_merge_size=2)


# -- 2. the collator: layout and the check of every image's features against its tokens --------------


def _rope(rows: list[dict[str, Any]], image_token_id: int) -> list[np.ndarray]:
    """Each row's mRoPE positions as mrope_positions gives them from the row's own columns."""
    return [
        mrope_positions(
            r["input_ids"], r["seq_lengths"], r["image_grid"], image_token_id=image_token_id, spatial_merge_size=2
        )
        for r in rows
    ]


def test_flatten_layout(proc: VisionProcessor, rows: list[dict[str, Any]], image_token_id: int) -> None:
    batch = VisionCollator(proc, image_token_id=image_token_id)(rows)
    assert set(batch) == {"input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw"}
    text = PackedCollator("flatten")(rows)
    total = sum(len(r["input_ids"]) for r in rows)
    for key in ("input_ids", "labels"):
        assert torch.equal(batch[key], text[key]) and batch[key].shape == (1, total)
    positions = batch["position_ids"]
    assert positions.shape == (4, 1, total) and positions.dtype == torch.int64
    assert torch.equal(positions[0], text["position_ids"])  # row 0: the text positions, restarting per sample
    assert positions[1:, 0].numpy().tolist() == np.concatenate(_rope(rows, image_token_id), axis=1).tolist()
    grids = [g for r in rows for g in r["image_grid"]]
    assert batch["image_grid_thw"].tolist() == grids and batch["image_grid_thw"].dtype == torch.int64
    assert batch["pixel_values"].shape == (sum(int(np.prod(g)) for g in grids), 3 * 2 * 14 * 14)
    assert batch["pixel_values"].dtype == torch.float32
    # The image tokens of the batch are exactly the images' feature counts, in order.
    assert int((batch["input_ids"] == image_token_id).sum()) == sum(int(np.prod(g)) // 4 for g in grids)
    with_boundaries = VisionCollator(proc, image_token_id=image_token_id, boundaries=True)(rows)
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
        assert torch.equal(torch.as_tensor(with_boundaries[key]), torch.as_tensor(text[key])), key


def test_padded_layout(proc: VisionProcessor, rows: list[dict[str, Any]], image_token_id: int) -> None:
    batch = VisionCollator(proc, "padded", pad_token_id=7, image_token_id=image_token_id)(rows)
    width = max(len(r["input_ids"]) for r in rows)
    assert batch["input_ids"].shape == (2, width) and batch["position_ids"].shape == (4, 2, width)
    for k, (row, rope) in enumerate(zip(rows, _rope(rows, image_token_id), strict=True)):
        n = len(row["input_ids"])
        assert batch["position_ids"][0, k, :n].tolist() == row["position_ids"]
        assert batch["position_ids"][1:, k, :n].numpy().tolist() == rope.tolist()
        # the padding is a segment of its own in all four: positions from 0 again
        assert batch["position_ids"][:, k, n:].tolist() == [list(range(width - n))] * 4
    assert batch["image_grid_thw"].tolist() == [g for r in rows for g in r["image_grid"]]


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_a_feature_count_that_differs_from_the_tokens_is_one_line_naming_sample_and_image(
    proc: VisionProcessor, samples: list[Sample], image_token_id: int
) -> None:
    collate = VisionCollator(proc, image_token_id=image_token_id)
    # Sample 2's second image packed with one image token fewer than the image processor gives features.
    sample = samples[2]
    cut = sample.offsets[1]
    short = dataclasses.replace(
        sample,
        ids=sample.ids[:cut] + sample.ids[cut + 1 :],
        labels=sample.labels[:cut] + sample.labels[cut + 1 :],
        measured=[sample.measured[0], dataclasses.replace(sample.measured[1], count=sample.measured[1].count - 1)],
    )
    row = _pack([samples[0], short], [10, 12])
    count = sample.measured[1].count
    with pytest.raises(IncompatibleError) as exc:
        collate([row])
    assert _one_line(exc) == (
        f"row 0 of the batch, sample 1 (sample_index 12), image 2 ({sample.paths[1]}): the image processor gives "
        f"{count} image features (grid {list(sample.measured[1].grid)}), the row holds {count - 1} image tokens "
        f"(grid {list(sample.measured[1].grid)}); pack the data again with this processor"
    )


def test_an_image_changed_since_packing_is_caught(
    proc: VisionProcessor, samples: list[Sample], image_token_id: int, tmp_path: Path
) -> None:
    path = tmp_path / "moving.png"
    shutil.copy(samples[0].paths[0], path)
    row = _pack([dataclasses.replace(samples[0], paths=[str(path)])], [0])
    collate = VisionCollator(proc, image_token_id=image_token_id)
    collate([row])
    make_image(path, 200, 120)  # rewritten at another size after packing
    with pytest.raises(IncompatibleError) as exc:
        collate([row])
    assert "sample 0 (sample_index 0), image 0" in _one_line(exc)
    assert "(it is 200x120 now, 56x84 when packed)" in str(exc.value)
    path.unlink()
    with pytest.raises(InputError, match=r"image .*moving\.png does not exist"):
        collate([row])


@pytest.mark.parametrize("damage", ["offset", "trained", "stray_token", "sample", "missing_column", "no_source"])
def test_rows_whose_images_do_not_fit_their_tokens_are_refused(
    damage: str, proc: VisionProcessor, rows: list[dict[str, Any]], image_token_id: int
) -> None:
    row = {k: list(v) if isinstance(v, list) else v for k, v in rows[0].items()}
    expected = {
        "offset": r"image 1 \(.*\): tokens \d+ to \d+ of the row are not all the image token",
        "trained": r"image 0 \(.*\): its image tokens are trained",
        "stray_token": r"row 0 of the batch holds \d+ image tokens, its 3 images account for \d+",
        "sample": r"image 2 \(.*\): its \d+ image tokens at \d+ are not inside its sample",
        "missing_column": "the row has 3 images but no image_grid column",
        "no_source": r"image 0 \(<0 bytes>\): the row holds neither its path nor its bytes",
    }[damage]
    if damage == "offset":
        row["image_offsets"][1] -= 1
    elif damage == "trained":
        at = row["image_offsets"][0]
        row["labels"][at] = image_token_id
    elif damage == "stray_token":
        row["input_ids"][-1] = image_token_id
    elif damage == "sample":
        row["image_sample"][2] = 0
    elif damage == "missing_column":
        del row["image_grid"]
    else:
        row["image_refs"][0] = None
    with pytest.raises(IncompatibleError, match=expected) as exc:
        VisionCollator(proc, image_token_id=image_token_id)([row])
    _one_line(exc)


def test_images_as_bytes_and_through_parquet_give_the_same_batch(
    proc: VisionProcessor, samples: list[Sample], rows: list[dict[str, Any]], image_token_id: int, tmp_path: Path
) -> None:
    collate = VisionCollator(proc, image_token_id=image_token_id)
    expected = collate(rows)
    embedded = [_pack(samples[:3], [0, 1, 2], embed=True), _pack(samples[3:], [3, 4], embed=True)]
    as_bytes = [{**r, "image_refs": [None] * len(r["image_refs"])} for r in embedded]
    # The row schema in Parquet: list<string|null>, list<binary|null>, list<list<int32>>, list<int32>.
    int32s, pairs = pa.list_(pa.int32()), pa.list_(pa.list_(pa.int32()))
    schema = pa.schema(
        [
            *(
                (k, pa.list_(pa.int32()))
                for k in ("input_ids", "labels", "position_ids", "seq_lengths", "sample_index")
            ),
            ("image_refs", pa.list_(pa.string())),
            ("image_bytes", pa.list_(pa.binary())),
            ("image_sizes", pairs),
            ("image_grid", pairs),
            *((k, int32s) for k in ("image_tokens", "image_offsets", "image_sample")),
        ]
    )
    pq.write_table(pa.Table.from_pylist(as_bytes, schema=schema), tmp_path / "shard-00000.parquet")
    from datasets import Dataset

    read = pq.read_table(tmp_path / "shard-00000.parquet").to_pylist()
    dataset = Dataset.from_parquet(str(tmp_path / "shard-00000.parquet"), cache_dir=str(tmp_path / "cache"))
    for variant in (embedded, as_bytes, read, [dataset[0], dataset[1]]):
        got = collate(variant)
        assert set(got) == set(expected)
        for key, value in expected.items():
            assert torch.equal(got[key], value), key


def test_the_model_is_checked_against_the_processor(proc: VisionProcessor, qwen_dir: Path, image_token_id: int) -> None:
    model = RECIPE.tiny_model(qwen_dir)
    assert VisionCollator(proc, model=model).image_token_id == image_token_id
    assert VisionCollator(str(qwen_dir)).image_token_id == image_token_id  # from the processor's tokenizer
    with pytest.raises(IncompatibleError, match=f"the model's image token id is {image_token_id}, not 5"):
        VisionCollator(proc, model=model, image_token_id=5)
    model.config.vision_config.spatial_merge_size = 4
    with pytest.raises(IncompatibleError, match="the model merges 4x4 patches, the image processor 2x2"):
        VisionCollator(proc, model=model)


def test_a_family_without_mrope_gets_pixel_values_and_text_positions(
    proc: VisionProcessor, samples: list[Sample], image_token_id: int
) -> None:
    """LLaVA-style: a fixed count per image, pixel_values only, the text collator's positions."""
    from transformers import CLIPImageProcessorPil

    clip = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    llava = dataclasses.replace(
        proc, family="llava", image_processor=clip, rule=lambda _, h, w: ImageTokens(3, proc.image_token * 3)
    )

    def fixed(sample: Sample) -> Sample:  # every image becomes 3 image tokens
        ids, labels, offsets = list(sample.ids), list(sample.labels), []
        for offset, measured in sorted(zip(sample.offsets, sample.measured, strict=True), reverse=True):
            ids[offset : offset + measured.count] = [image_token_id] * 3
            labels[offset : offset + measured.count] = [IGNORE_INDEX] * 3
        for offset in sample.offsets:
            offsets.append(
                offset - sum(m.count - 3 for o, m in zip(sample.offsets, sample.measured, strict=True) if o < offset)
            )
        return dataclasses.replace(
            sample, ids=ids, labels=labels, offsets=offsets, measured=[ImageTokens(3, "")] * len(offsets)
        )

    rows = [_pack([fixed(s) for s in samples[:3]], [0, 1, 2]), _pack([fixed(s) for s in samples[3:]], [3, 4])]
    batch = VisionCollator(llava, image_token_id=image_token_id)(rows)
    text = PackedCollator("flatten")(rows)
    assert set(batch) == {"input_ids", "labels", "position_ids", "pixel_values"}
    assert torch.equal(batch["position_ids"], text["position_ids"])
    assert batch["pixel_values"].shape == (sum(len(r["image_refs"]) for r in rows), 3, 28, 28)
    other = dataclasses.replace(llava, rule=lambda _, h, w: ImageTokens(4, proc.image_token * 4))
    with pytest.raises(IncompatibleError) as exc:
        VisionCollator(other, image_token_id=image_token_id)(rows)
    assert _one_line(exc).startswith(
        f"row 0 of the batch, sample 0 (sample_index 0), image 0 ({samples[0].paths[0]}): "
    )
    assert str(exc.value).endswith(
        "the llava processor gives 4 image features, the row holds 3 image tokens; "
        "pack the data again with this processor"
    )

    def refuse(_: VisionProcessor, height: int, width: int) -> ImageTokens:
        raise ValueError("too small")

    with pytest.raises(IncompatibleError, match="the model takes mRoPE positions, which packcli computes for qwen2_vl"):
        VisionCollator(llava, model=RECIPE.tiny_model(proc.name))  # its positions would leak across samples
    with pytest.raises(IncompatibleError) as exc:
        VisionCollator(dataclasses.replace(llava, rule=refuse), image_token_id=image_token_id)(rows)
    assert _one_line(exc).endswith(
        "image 0 (" + samples[0].paths[0] + "): the llava image processor refuses a 56x84 image: too small"
    )


# -- 3. loss parity on a tiny Qwen2-VL-family model --------------------------------------------------


@pytest.fixture(scope="module", params=MODELS, ids=["-".join(m) for m in MODELS])
def model(request: pytest.FixtureRequest, qwen_dir: Path) -> Any:
    family, attn = request.param
    # A wide initialisation keeps the attention sharp: a sample that sees another one moves its loss visibly.
    built = RECIPE.tiny_model(qwen_dir, family=family, attn=attn, initializer_range=1.0).eval()
    assert built.config._attn_implementation == attn
    return built


def _forward_stats(model: Any, labels: torch.Tensor, lengths: list[list[int]], **inputs: Any) -> list[Stats]:
    """One forward pass; the loss of each segment of each batch row (``lengths[k]`` for row k)."""
    hidden = model.model(**inputs, use_cache=False).last_hidden_state
    stats: list[Stats] = []
    for k, row_lengths in enumerate(lengths):
        start = 0
        for n in row_lengths:  # shift inside each segment: its last position predicts nothing
            target = labels[k, start + 1 : start + n]
            trained = target != IGNORE_INDEX
            logits = model.lm_head(hidden[k, start : start + n - 1][trained])
            stats.append((float(F.cross_entropy(logits, target[trained], reduction="sum")), int(trained.sum())))
            start += n
    return stats


def _alone_stats(model: Any, proc: VisionProcessor, ids: list[int], labels: list[int], paths: list[str]) -> Stats:
    """One sample run alone, the model computing its own positions (get_rope_index) from mm_token_type_ids;
    ``labels`` unshifted, its first token never trained."""
    from PIL import Image, ImageOps

    tensor = torch.tensor(ids)[None]
    inputs: dict[str, Any] = {"input_ids": tensor}
    if paths:
        images = [ImageOps.exif_transpose(Image.open(p)).convert("RGB") for p in paths]
        features = proc.image_processor(images=images, return_tensors="pt")
        inputs |= dict(features) | {"mm_token_type_ids": (tensor == model.config.image_token_id).int()}
    with torch.no_grad():
        return _forward_stats(model, torch.tensor([IGNORE_INDEX, *labels[1:]])[None], [[len(ids)]], **inputs)[0]


@pytest.fixture(scope="module")
def alone(model: Any, proc: VisionProcessor, samples: list[Sample]) -> list[Stats]:
    """Each sample run alone (``_alone_stats``)."""
    return [_alone_stats(model, proc, s.ids, s.labels, s.paths) for s in samples]


def _relative(stats: list[Stats], alone: list[Stats]) -> list[float]:
    diffs = []
    for (total, count), (alone_total, alone_count) in zip(stats, alone, strict=True):
        assert count == alone_count > 0
        diffs.append(abs(total / count - alone_total / alone_count) / abs(alone_total / alone_count))
    return diffs


@pytest.mark.parametrize("mode", ["flatten", "padded"])
def test_packed_loss_equals_alone(
    mode: str, model: Any, proc: VisionProcessor, rows: list[dict[str, Any]], alone: list[Stats]
) -> None:
    batch = VisionCollator(proc, mode, model=model)(rows)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    flat = [n for r in rows for n in r["seq_lengths"]]
    lengths = [flat] if mode == "flatten" else [r["seq_lengths"] for r in rows]
    with torch.no_grad():
        diffs = _relative(_forward_stats(model, batch["labels"], lengths, **inputs), alone)
    losses = [total / count for total, count in alone]
    print(
        f"\n{model.config.model_type} {model.config._attn_implementation} {mode}: alone losses "
        f"{[round(x, 4) for x in losses]}, max relative difference packed vs alone {max(diffs):.2e}"
    )
    assert max(diffs) <= REL_TOL, f"a sample's packed loss differs from its alone loss by {max(diffs):.2e}"


@pytest.mark.parametrize("variant", ["text_positions_not_restarted", "mrope_rows_only", "model_positions_over_the_row"])
def test_positions_left_unpacked_change_the_loss(
    variant: str, model: Any, proc: VisionProcessor, rows: list[dict[str, Any]], alone: list[Stats]
) -> None:
    """Without text positions restarting per sample (or given the three mRoPE rows only, or no positions at
    all, so that the model computes them over the whole row), the model builds a plain causal mask over the
    row and every later sample sees the ones before it."""
    batch = VisionCollator(proc, "flatten", model=model)(rows)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    positions = inputs["position_ids"]
    if variant == "text_positions_not_restarted":
        inputs["position_ids"] = torch.cat([torch.arange(positions.shape[-1]).view(1, 1, -1), positions[1:]])
    elif variant == "mrope_rows_only":
        inputs["position_ids"] = positions[1:]
    else:
        del inputs["position_ids"]
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == model.config.image_token_id).int()
    flat = [n for r in rows for n in r["seq_lengths"]]
    with torch.no_grad():
        diffs = _relative(_forward_stats(model, batch["labels"], [flat], **inputs), alone)
    assert diffs[0] <= REL_TOL  # the first sample of the batch has nothing before it to see
    later = diffs[1:]
    print(
        f"\n{model.config.model_type} {model.config._attn_implementation} {variant}: later samples off by "
        f"{min(later):.1e} to {max(later):.1e} relative"
    )
    assert min(later) > 10 * REL_TOL, f"{variant}: a later sample's loss moved by only {min(later):.2e}"
    assert float(np.median(later)) > LEAK, f"{variant}: the later samples' losses moved by {np.median(later):.2e}"


def _packed_corpus(cases: list[Case], root: Path, pack: Any, qwen_dir: Path) -> Any:
    """The conversations, and text-only ones mixed in, packed by ``packcli pack --processor`` into rows of
    several samples each; the rows as the recipe reads them (``load_rows``)."""
    text = [
        [{"role": "user", "content": f"Count to {n}."}, _answer(" ".join(str(k) for k in range(1, n + 1)))]
        for n in (3, 9)
    ]
    records = [{"images": [str(p) for p in paths], "messages": messages} for messages, paths in cases]
    records += [{"messages": messages} for messages in text]
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = root / "out"
    pack(data, "-o", out, "--processor", qwen_dir, "--max-len", "160")
    return RECIPE.load_rows(out, cache_dir=str(root / "datasets"))


@pytest.mark.parametrize("mode", ["flatten", "padded"])
def test_packed_loss_equals_alone_on_real_pack_output(
    mode: str, model: Any, proc: VisionProcessor, cases: list[Case], qwen_dir: Path, tmp_path: Path, pack: Any
) -> None:
    """Rows written by ``packcli pack --processor`` and read by the recipe: each sample's loss in its row
    equals its loss alone (its ids, labels and images as the row holds them, the model's own positions)."""
    dataset = _packed_corpus(cases, tmp_path, pack, qwen_dir)
    rows = [dataset[k] for k in range(len(dataset))]
    assert len(rows) > 1 and all(len(r["input_ids"]) <= 160 for r in rows)
    assert any(len(r["seq_lengths"]) > 2 and r["image_refs"] for r in rows)  # several samples, images among them
    assert sorted(i for r in rows for i in r["sample_index"]) == list(range(len(cases) + 2))
    alone: list[Stats] = []
    for row in rows:
        start = 0
        for j, n in enumerate(row["seq_lengths"]):
            paths = [ref for ref, s in zip(row["image_refs"], row["image_sample"], strict=True) if s == j]
            index = row["sample_index"][j]
            assert paths == [str(p) for p in (cases[index][1] if index < len(cases) else [])]
            ids, labels = row["input_ids"][start : start + n], row["labels"][start : start + n]
            alone.append(_alone_stats(model, proc, ids, labels, paths))
            start += n
    batch = VisionCollator(proc, mode, model=model)(rows)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    lengths = [[n for r in rows for n in r["seq_lengths"]]] if mode == "flatten" else [r["seq_lengths"] for r in rows]
    with torch.no_grad():
        diffs = _relative(_forward_stats(model, batch["labels"], lengths, **inputs), alone)
    print(
        f"\n{model.config.model_type} {model.config._attn_implementation} {mode}, packcli pack rows "
        f"{[list(r['sample_index']) for r in rows]}: max relative difference packed vs alone {max(diffs):.2e}"
    )
    assert max(diffs) <= REL_TOL, f"a sample's packed loss differs from its alone loss by {max(diffs):.2e}"


# -- 4. the recipe -----------------------------------------------------------------------------------


def test_recipe_trains_on_packed_image_text_rows(qwen_dir: Path, rows: list[dict[str, Any]]) -> None:
    model = RECIPE.tiny_model(qwen_dir, seed=1)
    model.config.use_cache = True  # the recipe must switch it off itself
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    losses = RECIPE.train(model, rows, qwen_dir, steps=4, batch_size=2, lr=1e-3)
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], f"the loss should go down on the same rows: {losses}"
    assert model.config.use_cache is False
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert any(name.startswith("model.visual.") for name in changed), "the vision tower should be trained too"
    assert "lm_head.weight" in changed
