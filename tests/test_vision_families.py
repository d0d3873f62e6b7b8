"""LLaVA, LLaVA-NeXT, Idefics3 and SmolVLM: packcli's image tokens from the image's size equal what the
model's own processor makes of the image's pixels.

Each processor is built in the test with its model's published configuration (tests/vision.py), the
128k tokenizer with the model's vision tokens and the model's official template from trl. Where the
processor class constructs here (LlavaProcessor, LlavaNextProcessor, Idefics3Processor), it is built
here from those configurations, independently of packcli, and called on the real pixels: its ids equal
the tokenizer's encoding of the rendered conversation with packcli's text in place of the placeholder.
SmolVLMProcessor does not construct here (it needs a video processor, which needs torchvision, and
``num2words``): its image processor runs on the real pixels, and the processor's own
``replace_image_token`` (its documented expansion rule) runs on that output.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from packcli.errors import TokenizerError
from packcli.vision import ImageRef, image_size, load_processor
from tests.vision import (
    IDEFICS3_IMAGE_CONFIG,
    IDEFICS3_PROCESSOR_CONFIG,
    LLAVA_IMAGE_CONFIG,
    LLAVA_NEXT_IMAGE_CONFIG,
    LLAVA_NEXT_PROCESSOR_CONFIG,
    LLAVA_PROCESSOR_CONFIG,
    SMOLVLM_IMAGE_CONFIG,
    SMOLVLM_PROCESSOR_CONFIG,
    make_idefics3_processor,
    make_image,
    make_llava_next_processor,
    make_llava_processor,
    make_smolvlm_processor,
)

# (width, height): tiny, small, square, very wide, very tall, large, odd, and at tile and pinpoint edges.
SIZES = [
    (7, 10),
    (100, 3),
    (224, 224),
    (336, 336),
    (2000, 20),
    (20, 2000),
    (4000, 3000),
    (333, 517),
    (1001, 999),
    (365, 730),
    (1456, 365),
    (672, 336),
    (800, 600),
]

MESSAGES = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Noise, in many colours."}]},
]


def _hf_processor(directory: Path, cls: str, image_cls: str, image: dict[str, Any], config: dict[str, Any]) -> Any:
    """The processor class built here from the model's configurations (not through packcli)."""
    import transformers
    from transformers import AutoTokenizer

    kwargs = {k: v for k, v in config.items() if k != "processor_class"}
    image_processor = getattr(transformers, image_cls)(**image)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return getattr(transformers, cls)(image_processor=image_processor, tokenizer=tokenizer, **kwargs)


@dataclass
class Built:
    """A processor directory, packcli's processor loaded from it, the processor class built here (None
    where it does not construct), its tokenizer, and the conversation rendered by the model's template."""

    directory: Path
    proc: Any
    hf: Any
    tok: Any
    rendered: str


def _build(directory: Path, hf: Any) -> Built:
    from transformers import AutoTokenizer

    proc = load_processor(str(directory))
    tok = hf.tokenizer if hf is not None else AutoTokenizer.from_pretrained(str(directory))
    rendered = tok.apply_chat_template(MESSAGES, chat_template=proc.chat_template, tokenize=False)
    assert rendered.count(proc.image_token) == 1
    return Built(directory, proc, hf, tok, rendered)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], Path]:
    out = tmp_path_factory.mktemp("images")
    return {(w, h): make_image(out / f"{w}x{h}.png", w, h) for w, h in SIZES}


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Built:
    directory = make_llava_processor(tmp_path_factory.mktemp("llava"))
    return _build(
        directory,
        _hf_processor(directory, "LlavaProcessor", "CLIPImageProcessorPil", LLAVA_IMAGE_CONFIG, LLAVA_PROCESSOR_CONFIG),
    )


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory: pytest.TempPathFactory) -> Built:
    directory = make_llava_next_processor(tmp_path_factory.mktemp("llava_next"))
    hf = _hf_processor(
        directory,
        "LlavaNextProcessor",
        "LlavaNextImageProcessorPil",
        LLAVA_NEXT_IMAGE_CONFIG,
        LLAVA_NEXT_PROCESSOR_CONFIG,
    )
    return _build(directory, hf)


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory: pytest.TempPathFactory) -> Built:
    directory = make_idefics3_processor(tmp_path_factory.mktemp("idefics3"))
    hf = _hf_processor(
        directory, "Idefics3Processor", "Idefics3ImageProcessorPil", IDEFICS3_IMAGE_CONFIG, IDEFICS3_PROCESSOR_CONFIG
    )
    return _build(directory, hf)


@pytest.fixture(scope="module")
def smolvlm_instruct(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """SmolVLM-Instruct as its repository saves it: an Idefics3Processor with SmolVLM's values."""
    config = {**SMOLVLM_PROCESSOR_CONFIG, "processor_class": "Idefics3Processor"}
    directory = make_smolvlm_processor(tmp_path_factory.mktemp("smolvlm_instruct"), processor_class="Idefics3Processor")
    hf = _hf_processor(directory, "Idefics3Processor", "Idefics3ImageProcessorPil", SMOLVLM_IMAGE_CONFIG, config)
    return _build(directory, hf)


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return _build(make_smolvlm_processor(tmp_path_factory.mktemp("smolvlm")), None)


def _measure_and_pixels(built: Built, path: Path) -> tuple[Any, Any]:
    """packcli's measure from the image's header, and the decoded image."""
    from PIL import Image

    measured = built.proc.measure(*image_size(ImageRef(path=str(path))))
    with Image.open(path) as im:
        return measured, im.convert("RGB")


def _assert_processor_ids(built: Built, measured: Any, pixels: Any) -> Any:
    """The processor's ids for the rendered text and the pixels equal the tokenizer's for packcli's text."""
    hf = built.hf
    real = hf(text=built.rendered, images=[pixels])
    ids = list(real["input_ids"][0])
    expanded = built.rendered.replace(built.proc.image_token, measured.text, 1)
    assert ids == hf.tokenizer(expanded)["input_ids"]
    assert ids.count(hf.image_token_id) == measured.count
    return real


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_llava_count_equals_the_llava_processor_on_the_pixels(
    llava: Built, images: dict[tuple[int, int], Path], width: int, height: int
) -> None:
    measured, pixels = _measure_and_pixels(llava, images[width, height])
    assert (llava.proc.family, llava.proc.needs_size, measured.grid) == ("llava", False, ())
    real = _assert_processor_ids(llava, measured, pixels)
    # 336 / 14 = 24 patches a side, plus the CLS, minus it again for the "default" feature strategy.
    assert measured.count == 576
    assert tuple(real["pixel_values"][0].shape) == (3, 336, 336)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_llava_next_count_equals_the_llava_next_processor_on_the_pixels(
    llava_next: Built, images: dict[tuple[int, int], Path], width: int, height: int
) -> None:
    measured, pixels = _measure_and_pixels(llava_next, images[width, height])
    assert (llava_next.proc.family, llava_next.proc.needs_size) == ("llava_next", True)
    real = _assert_processor_ids(llava_next, measured, pixels)
    assert measured.grid == tuple(int(x) for x in real["image_sizes"][0]) == (height, width)


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize("model", ["idefics3", "smolvlm_instruct"])
def test_idefics3_text_equals_the_idefics3_processor_on_the_pixels(
    model: str, request: pytest.FixtureRequest, images: dict[tuple[int, int], Path], width: int, height: int
) -> None:
    built: Built = request.getfixturevalue(model)
    measured, pixels = _measure_and_pixels(built, images[width, height])
    assert (built.proc.family, built.proc.needs_size) == ("idefics3", True)
    real = _assert_processor_ids(built, measured, pixels)
    tiles = built.hf.image_processor(images=[pixels], return_row_col_info=True)
    rows, cols = tiles["rows"][0][0], tiles["cols"][0][0]
    assert measured.grid == (rows, cols)
    assert real["pixel_values"].shape[1] == rows * cols + 1  # the tiles and the whole image
    assert measured.count == built.hf.image_seq_len * (rows * cols + 1)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_smolvlm_text_equals_the_processors_expansion_of_the_image_processors_output(
    smolvlm: Built, images: dict[tuple[int, int], Path], width: int, height: int
) -> None:
    from transformers import SmolVLMImageProcessorPil, SmolVLMProcessor

    measured, pixels = _measure_and_pixels(smolvlm, images[width, height])
    assert (smolvlm.proc.family, smolvlm.proc.needs_size) == ("smolvlm", True)
    real = SmolVLMImageProcessorPil(**SMOLVLM_IMAGE_CONFIG)(images=[pixels], return_row_col_info=True)
    rows, cols = real["rows"][0][0], real["cols"][0][0]
    assert measured.grid == (rows, cols)
    assert real["pixel_values"].shape[1] == rows * cols + 1
    # SmolVLMProcessor.replace_image_token on the pixels' output, with what its __init__ would hold.
    held = SimpleNamespace(
        image_seq_len=SMOLVLM_PROCESSOR_CONFIG["image_seq_len"],
        fake_image_token="<fake_token_around_image>",
        image_token="<image>",
        global_image_token="<global-img>",
    )
    text = SmolVLMProcessor.replace_image_token(held, real, 0)  # type: ignore[arg-type]
    assert measured.text == text
    tok, rendered = smolvlm.tok, smolvlm.rendered
    ids = tok(rendered.replace("<image>", measured.text, 1))["input_ids"]
    assert ids == tok(rendered.replace("<image>", text, 1))["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids("<image>")) == measured.count == 81 * (rows * cols + 1)


@pytest.mark.parametrize("model", ["llava", "llava_next", "idefics3"])
def test_two_images_of_different_sizes_expand_in_order_as_the_processor_does(
    model: str, request: pytest.FixtureRequest, images: dict[tuple[int, int], Path]
) -> None:
    from PIL import Image

    built: Built = request.getfixturevalue(model)
    two = [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The first is wider."}]},
    ]
    rendered = built.tok.apply_chat_template(two, chat_template=built.proc.chat_template, tokenize=False)
    paths = [images[2000, 20], images[333, 517]]
    measured = [built.proc.measure(*image_size(ImageRef(path=str(path)))) for path in paths]
    between = rendered.split(built.proc.image_token)
    assert len(between) == 3
    expanded = between[0] + measured[0].text + between[1] + measured[1].text + between[2]
    pixels = []
    for path in paths:
        with Image.open(path) as im:
            pixels.append(im.convert("RGB"))
    ids = list(built.hf(text=rendered, images=pixels)["input_ids"][0])
    assert ids == built.hf.tokenizer(expanded)["input_ids"]
    assert ids.count(built.hf.image_token_id) == measured[0].count + measured[1].count


def _tiles_both_ways(cls: str, config: dict[str, Any], sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sizes where the image processor's size-only tiles (``get_number_of_image_patches``) differ from
    the tiles its pixels path cuts (its own ``resize``, ``resize_for_vision_encoder``, ``split_images``),
    run with a resize that makes an empty image of the size the real one computes, so no pixel is touched."""
    import importlib

    import numpy as np
    import transformers

    base = getattr(transformers, cls)
    module = importlib.import_module(base.__module__)

    class ShapeOnly(base):  # type: ignore[misc, valid-type]
        def resize(self, image: Any, size: Any, resample: Any = None, **kwargs: Any) -> Any:
            if size.longest_edge:
                height, width = module.get_resize_output_image_size(image, resolution_max_side=size.longest_edge)
            else:
                height, width = size.height, size.width
            return np.empty((3, height, width), dtype=np.uint8)

    ip = ShapeOnly(**config)
    tile = dict(ip.max_image_size)
    differ = []
    for height, width in sizes:
        image = ip.resize_for_vision_encoder(
            ip.resize(np.empty((3, height, width), np.uint8), ip.size), tile["longest_edge"]
        )
        _, rows, cols = ip.split_images(image, tile)
        if ip.get_number_of_image_patches(height, width, {})[1:] != (rows, cols):
            differ.append((height, width))
    return differ


@pytest.mark.parametrize(
    ("cls", "config"),
    [("Idefics3ImageProcessorPil", IDEFICS3_IMAGE_CONFIG), ("SmolVLMImageProcessorPil", SMOLVLM_IMAGE_CONFIG)],
)
def test_the_size_only_tiles_equal_the_pixels_path_for_whole_tiles_and_differ_otherwise(
    cls: str, config: dict[str, Any]
) -> None:
    sides = [*range(1, 300, 7), *range(300, 5000, 61)]
    sizes = [(h, w) for h in sides for w in [*range(1, 300, 5), *range(300, 5000, 47)]]
    assert _tiles_both_ways(cls, config, sizes) == []
    # A longest edge of no whole tiles: the two disagree (4x11 pixels: 2x3 tiles cut, 1x3 counted), which
    # is why load_processor refuses it (test_a_configuration_the_rule_cannot_follow_is_refused_in_one_line).
    uneven = {**config, "size": {"longest_edge": 1000}, "max_image_size": {"longest_edge": 364}}
    assert _tiles_both_ways(cls, uneven, [(4, 11), (1000, 1000)]) == [(4, 11)]


def _variant(
    source: Path, out: Path, image: Callable[[dict[str, Any]], None], processor: Callable[[dict[str, Any]], None]
) -> Path:
    """A copy of a saved processor with its preprocessor_config.json / processor_config.json changed."""
    shutil.copytree(source, out)
    for name, change in (("preprocessor_config.json", image), ("processor_config.json", processor)):
        data = json.loads((out / name).read_text(encoding="utf-8"))
        change(data)
        (out / name).write_text(json.dumps(data), encoding="utf-8")
    return out


def _keep(data: dict[str, Any]) -> None:
    pass


@pytest.mark.parametrize(
    ("model", "cls", "image_cls", "image", "config", "change"),
    [
        (
            "idefics3",
            "Idefics3Processor",
            "Idefics3ImageProcessorPil",
            IDEFICS3_IMAGE_CONFIG,
            IDEFICS3_PROCESSOR_CONFIG,
            {"do_image_splitting": False},
        ),
        (
            "llava_next",
            "LlavaNextProcessor",
            "LlavaNextImageProcessorPil",
            LLAVA_NEXT_IMAGE_CONFIG,
            LLAVA_NEXT_PROCESSOR_CONFIG,
            {"size": {"height": 336, "width": 336}},
        ),
    ],
)
def test_other_configurations_the_rule_follows_equal_the_processor_on_the_pixels(
    model: str,
    cls: str,
    image_cls: str,
    image: dict[str, Any],
    config: dict[str, Any],
    change: dict[str, Any],
    request: pytest.FixtureRequest,
    images: dict[tuple[int, int], Path],
    tmp_path: Path,
) -> None:
    source: Built = request.getfixturevalue(model)
    directory = _variant(source.directory, tmp_path / "variant", lambda d: d.update(change), _keep)
    built = _build(directory, _hf_processor(directory, cls, image_cls, {**image, **change}, config))
    for size in [(2000, 20), (333, 517), (1456, 365)]:
        measured, pixels = _measure_and_pixels(built, images[size])
        _assert_processor_ids(built, measured, pixels)
        if model == "idefics3":  # not split: the whole image alone
            assert measured.grid == (0, 0) and measured.count == 169


@pytest.mark.parametrize(
    ("model", "image", "processor", "message"),
    [
        ("llava", _keep, lambda d: d.update(vision_feature_select_strategy="defualt"), "is 'defualt'"),
        ("llava", _keep, lambda d: d.pop("patch_size"), "needs a positive integer patch_size, not None"),
        ("llava", _keep, lambda d: d.update(num_additional_image_tokens=-1), "num_additional_image_tokens is -1"),
        ("llava", lambda d: d.update(do_center_crop=False), _keep, r"does not centre-crop"),
        ("llava_next", lambda d: d.update(image_grid_pinpoints=[[336]]), _keep, r"image_grid_pinpoints is \[\[336\]\]"),
        ("llava_next", lambda d: d.update(crop_size={"height": 224, "width": 224}), _keep, "is not its size"),
        ("idefics3", lambda d: d.update(size={"longest_edge": 1000}), _keep, "1000 is not whole tiles of 364"),
        ("idefics3", lambda d: d.update(do_resize=False), _keep, r"without resizing them first"),
        ("idefics3", _keep, lambda d: d.update(image_seq_len=0), "image_seq_len is 0"),
        ("smolvlm", _keep, lambda d: d.update(image_seq_len="81"), "image_seq_len is '81'"),
        ("smolvlm", lambda d: d.update(max_image_size={}), _keep, "has no longest_edge"),
    ],
)
def test_a_configuration_the_rule_cannot_follow_is_refused_in_one_line(
    model: str,
    image: Callable[[dict[str, Any]], None],
    processor: Callable[[dict[str, Any]], None],
    message: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    source = request.getfixturevalue(model).directory
    directory = _variant(source, tmp_path / "variant", image, processor)
    with pytest.raises(TokenizerError, match=message) as err:
        load_processor(str(directory))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"processor '{directory}'")


def test_a_llava_next_name_over_a_plain_clip_image_processor_is_refused(llava: Built, tmp_path: Path) -> None:
    directory = _variant(
        llava.directory, tmp_path / "v", _keep, lambda d: d.update(processor_class="LlavaNextProcessor")
    )
    with pytest.raises(TokenizerError, match=r"image_grid_pinpoints is None, not a list") as err:
        load_processor(str(directory))
    assert "\n" not in str(err.value)


def test_smolvlm_takes_the_image_tokens_its_tokenizer_names(smolvlm: Built, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    directory = tmp_path / "renamed"
    shutil.copytree(smolvlm.directory, directory)
    config = directory / "tokenizer_config.json"
    data = json.loads(config.read_text(encoding="utf-8"))
    data["extra_special_tokens"] = {"fake_image_token": "<fake>", "global_image_token": "<whole>"}
    config.write_text(json.dumps(data), encoding="utf-8")
    # SmolVLMProcessor takes these from its tokenizer's attributes, which the tokenizer reads from here.
    tok = AutoTokenizer.from_pretrained(str(directory))
    assert (tok.fake_image_token, tok.global_image_token) == ("<fake>", "<whole>")
    text = load_processor(str(directory)).measure(20, 2000).text
    assert text.startswith("<fake><row_1_col_1><image>") and "\n<fake><whole><image>" in text
    assert "<fake_token_around_image>" not in text and "<global-img>" not in text
