"""The processor families packcli knows: each one's image rule, asked of the model's own processor code.

A family answers ``rule(parts, height, width) -> ImageTokens``: how many image tokens an image of that size
becomes, the exact text that replaces its placeholder, and the image's size parameters. Where the
processor class constructs here (LLaVA, LLaVA-NeXT, Idefics3), it is built once from the saved directory
(its image processor, its tokenizer, processor_config.json) and its own functions answer; where it does
not (Qwen2-VL needs torchvision for its video part, SmolVLM a video processor and ``num2words``), the image
processor's functions and the processor module's own functions answer. A configuration a family's rule
cannot follow exactly is refused when the processor is loaded, in one line, never guessed.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from packcli.errors import RecordError, TokenizerError, first_line
from packcli.jsontypes import JSONObject, TemplateKwargs


@dataclass(frozen=True)
class ImageTokens:
    """What one image becomes in the token sequence.

    ``count`` image tokens (the placeholder token repeated, which the model fills with the image's
    features); ``text`` replaces the image's placeholder in the rendered conversation (for most
    families ``image_token * count``; Idefics3 adds row/column markers); ``grid`` is the image's size
    parameters as the model takes them (Qwen2-VL: ``image_grid_thw``; LLaVA-NeXT: ``image_sizes``;
    Idefics3 / SmolVLM: the tiles' rows and columns; empty where there are none).
    """

    count: int
    text: str
    grid: tuple[int, ...] = ()


class ProcessorParts(Protocol):
    """What a family's rule reads of a loaded processor."""

    image_processor: Any
    image_token: str
    config: JSONObject
    # The processor class constructed here, or the parts of it the rule needs; None where the rule has none.
    processor: Any


Rule = Callable[[ProcessorParts, int, int], ImageTokens]
# (directory, image processor, processor config) -> the processor object the rule asks; raises TokenizerError.
Prepare = Callable[[Path, Any, JSONObject], Any]


@dataclass(frozen=True)
class Family:
    """One processor family: its name, default placeholder token, whether the count depends on the
    image's size, its rule, how its processor is made ready when loaded (None: nothing to make), and
    whether its images are packed."""

    name: str
    image_token: str
    needs_size: bool
    rule: Rule
    prepare: Prepare | None = None
    # True: an image becomes a pure run of image tokens (``ImageTokens.text`` is the token repeated);
    # False (Idefics3, SmolVLM: tile markers and newlines around the runs): rows carry ``image_spans``.
    pure: bool = True
    # False: measured exactly but not packed (refused at pack time, ``VisionProcessor.check_packable``).
    packs: bool = True


def _refuse(directory: Path, cls: str, what: str) -> TokenizerError:
    return TokenizerError(f"processor '{directory}' ({cls}): {what}; packcli does not guess an image's tokens")


def _construct(cls: str) -> Prepare:
    """Return a preparer that builds the processor class ``cls`` from the directory, as transformers does."""

    def prepare(directory: Path, image_processor: Any, config: JSONObject) -> Any:
        import transformers
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
        except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for one failure
            raise TokenizerError(
                f"cannot load the tokenizer of processor '{directory}': {first_line(exc)}; check the directory"
            ) from None
        parts = {"image_processor": image_processor, "tokenizer": tokenizer}
        klass = getattr(transformers, cls)
        try:
            return klass.from_args_and_dict([parts[a] for a in klass.get_attributes()], config)
        except Exception as exc:  # a missing token, a missing sub-processor, a bad value in processor_config.json
            raise _refuse(directory, cls, f"the processor class cannot be built: {first_line(exc)}") from None

    return prepare


def _qwen2_vl(parts: ProcessorParts, height: int, width: int) -> ImageTokens:
    """Qwen2-VL / Qwen2.5-VL: dynamic resolution, (height, width) resized to 28-pixel units.

    Path: the image processor's functions (``Qwen2VLProcessor`` does not construct without torchvision).
    The count is the image processor's ``get_number_of_image_patches`` over ``merge_size**2``, as
    ``Qwen2VLProcessor`` expands ``<|image_pad|>`` (``image_grid_thw.prod() // merge_size**2``); the grid
    is the image processor's own ``smart_resize`` in patches, one temporal patch per image.
    """
    ip = parts.image_processor
    module = importlib.import_module(type(ip).__module__)
    patch, merge = int(ip.patch_size), int(ip.merge_size)
    resized_h, resized_w = module.smart_resize(
        height, width, patch * merge, min_pixels=ip.size["shortest_edge"], max_pixels=ip.size["longest_edge"]
    )
    grid = (1, resized_h // patch, resized_w // patch)
    patches = int(ip.get_number_of_image_patches(height, width, {}))
    if patches != grid[1] * grid[2]:  # the two functions of the image processor disagree: never guess
        raise RecordError(
            "image_refused",
            f"the image processor gives {patches} patches for a {width}x{height} image, its grid {grid}",
        )
    count = patches // merge**2
    return ImageTokens(count, parts.image_token * count, grid)


def _check_llava(directory: Path, cls: str, image_processor: Any, config: JSONObject) -> None:
    """Refuse what the LLaVA processors' size-only count does not follow."""
    patch = config.get("patch_size")
    if not isinstance(patch, int) or isinstance(patch, bool) or patch <= 0:
        raise _refuse(directory, cls, f"processor_config.json needs a positive integer patch_size, not {patch!r}")
    strategy = config.get("vision_feature_select_strategy")
    if strategy not in ("default", "full"):  # the processor treats any other value as "full"
        raise _refuse(
            directory, cls, f"vision_feature_select_strategy is {strategy!r} in processor_config.json, not default/full"
        )
    extra = config.get("num_additional_image_tokens", 0)
    if not isinstance(extra, int) or isinstance(extra, bool) or extra < 0:
        raise _refuse(directory, cls, f"num_additional_image_tokens is {extra!r}, not a count")
    if not getattr(image_processor, "do_center_crop", False):
        # Without the crop the features follow the image's aspect; the processor's count assumes the crop.
        raise _refuse(directory, cls, "its image processor does not centre-crop (do_center_crop false)")


def _prepare_llava(directory: Path, image_processor: Any, config: JSONObject) -> Any:
    _check_llava(directory, "LlavaProcessor", image_processor, config)
    return _construct("LlavaProcessor")(directory, image_processor, config)


def _llava(parts: ProcessorParts, height: int, width: int) -> ImageTokens:
    """LLaVA (1.5): a fixed count, whatever the image's size.

    Path: the processor asked (``LlavaProcessor._get_num_multimodal_tokens``): the crop size in patches,
    plus ``num_additional_image_tokens`` (the CLS), minus one for the ``default`` feature strategy; the
    same as its ``replace_image_token`` gives from the cropped pixels.
    """
    count = int(parts.processor._get_num_multimodal_tokens(image_sizes=[[height, width]]).num_image_tokens[0])
    return ImageTokens(count, parts.image_token * count)


def _prepare_llava_next(directory: Path, image_processor: Any, config: JSONObject) -> Any:
    cls = "LlavaNextProcessor"
    _check_llava(directory, cls, image_processor, config)
    pinpoints = getattr(image_processor, "image_grid_pinpoints", None)
    if (
        not isinstance(pinpoints, list)
        or not pinpoints
        or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, int) for x in p) for p in pinpoints
        )
    ):
        raise _refuse(directory, cls, f"image_grid_pinpoints is {pinpoints!r}, not a list of [height, width]")
    # The size-only count takes the tiles as size's square; the pixels' count takes the tiles' real
    # shape (the crop). Where the two could differ, the configuration is refused.
    size, crop = dict(image_processor.size), dict(image_processor.crop_size or {})
    side = size.get("shortest_edge") or min(size.get("height", 0), size.get("width", 0))
    if (crop.get("height"), crop.get("width")) != (side, side):
        raise _refuse(directory, cls, f"its crop_size {crop} is not its size {size} as a square")
    return _construct(cls)(directory, image_processor, config)


def _llava_next(parts: ProcessorParts, height: int, width: int) -> ImageTokens:
    """LLaVA-NeXT (1.6): any resolution; the count depends on the image's size.

    Path: the processor asked (``LlavaNextProcessor._get_num_multimodal_tokens``, which runs its
    ``_get_number_of_features``: the best grid pinpoint by ``select_best_resolution``, the unpadded
    features plus one newline feature per row, plus the base image's features). The grid is the image's
    ``(height, width)``, the model's ``image_sizes`` entry.
    """
    count = int(parts.processor._get_num_multimodal_tokens(image_sizes=[[height, width]]).num_image_tokens[0])
    return ImageTokens(count, parts.image_token * count, (height, width))


def _check_splitting(directory: Path, cls: str, image_processor: Any) -> None:
    """Refuse an image-splitting configuration where the image processor's size-only count
    (``get_number_of_image_patches``) is not the one its pixels path gives.

    With splitting, the pixels path resizes the longest edge to ``size`` and then to whole tiles from the
    resized width; the size-only function takes whole tiles of each side. They agree when the image is
    resized and ``size`` is whole tiles (both sides then land on whole tiles the same way), as in the
    published Idefics3 and SmolVLM configurations.
    """
    ip = image_processor
    if not getattr(ip, "do_image_splitting", False):
        return
    module = importlib.import_module(type(ip).__module__)
    longest = (ip.size or {}).get("longest_edge")
    tile = (ip.max_image_size or {}).get("longest_edge")
    if not ip.do_resize:
        raise _refuse(directory, cls, "it splits images without resizing them first (do_resize false)")
    if not isinstance(longest, int) or not isinstance(tile, int) or tile <= 0:
        raise _refuse(directory, cls, f"size {ip.size} or max_image_size {ip.max_image_size} has no longest_edge")
    if longest % tile or longest > getattr(module, "MAX_IMAGE_SIZE", longest):
        raise _refuse(directory, cls, f"size's longest_edge {longest} is not whole tiles of {tile} pixels")


def _image_seq_len(directory: Path, cls: str, config: JSONObject, default: Any) -> int:
    value = config.get("image_seq_len", default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _refuse(directory, cls, f"image_seq_len is {value!r} in processor_config.json, not a positive count")
    return value


def _prepare_idefics3(directory: Path, image_processor: Any, config: JSONObject) -> Any:
    cls = "Idefics3Processor"
    _check_splitting(directory, cls, image_processor)
    _image_seq_len(directory, cls, config, 169)
    return _construct(cls)(directory, image_processor, config)


def _split_tokens(parts: ProcessorParts, text: str, rows: int, cols: int) -> ImageTokens:
    count = text.count(parts.image_token)
    return ImageTokens(count, text, (rows, cols))


def _idefics3(parts: ProcessorParts, height: int, width: int) -> ImageTokens:
    """Idefics3: image splitting into rows x cols tiles plus the whole image.

    Path: the image processor's ``get_number_of_image_patches`` gives (patches, rows, cols); the processor
    asked (``Idefics3Processor.replace_image_token`` on those rows and columns) gives the text:
    ``<fake_token_around_image><row_i_col_j>`` and ``image_seq_len`` image tokens per tile, a newline per
    row, then ``\\n<fake_token_around_image><global-img>``, the whole image's tokens and a closing
    ``<fake_token_around_image>``. The grid is (rows, cols); (0, 0) for an image not split.
    """
    _, rows, cols = (int(x) for x in parts.image_processor.get_number_of_image_patches(height, width, {}))
    text = parts.processor.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)
    return _split_tokens(parts, text, rows, cols)


@dataclass(frozen=True)
class SmolVLMParts:
    """What ``SmolVLMProcessor`` holds for its image text (it does not construct here: it needs a video
    processor, which needs torchvision, and ``num2words``): the tokens its tokenizer names, or its defaults."""

    image_seq_len: int
    fake_image_token: str
    image_token: str
    global_image_token: str


def _prepare_smolvlm(directory: Path, image_processor: Any, config: JSONObject) -> SmolVLMParts:
    cls = "SmolVLMProcessor"
    _check_splitting(directory, cls, image_processor)
    from transformers.models.smolvlm.processing_smolvlm import SmolVLMProcessor

    default = inspect.signature(SmolVLMProcessor.__init__).parameters["image_seq_len"].default
    named: TemplateKwargs = {}
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file():  # the processor reads these from its tokenizer's named special tokens
        try:
            special = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("extra_special_tokens")
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"cannot read {tokenizer_config}: {first_line(exc)}; check the directory") from None
        named = special if isinstance(special, dict) else {}
    return SmolVLMParts(
        image_seq_len=_image_seq_len(directory, cls, config, default),
        fake_image_token=str(named.get("fake_image_token", "<fake_token_around_image>")),
        image_token=str(named.get("image_token", "<image>")),
        global_image_token=str(named.get("global_image_token", "<global-img>")),
    )


def _smolvlm(parts: ProcessorParts, height: int, width: int) -> ImageTokens:
    """SmolVLM (``SmolVLMProcessor``): Idefics3's image splitting, with its own processor module.

    Path: the image processor's ``get_number_of_image_patches`` gives (patches, rows, cols); the text is
    the processor module's own ``get_image_prompt_string`` (what ``SmolVLMProcessor.replace_image_token``
    returns), with the processor's ``image_seq_len`` and tokens. The grid is (rows, cols).
    """
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    held: SmolVLMParts = parts.processor
    _, rows, cols = (int(x) for x in parts.image_processor.get_number_of_image_patches(height, width, {}))
    text = get_image_prompt_string(
        rows,
        cols,
        held.image_seq_len,
        fake_token_around_image=held.fake_image_token,
        image_token=held.image_token,
        global_image_token=held.global_image_token,
    )
    return _split_tokens(parts, text, rows, cols)


# Processor class, as processor_config.json / preprocessor_config.json names it -> its family.
FAMILIES: dict[str, Family] = {
    "Qwen2VLProcessor": Family("qwen2_vl", "<|image_pad|>", True, _qwen2_vl),
    "Qwen2_5_VLProcessor": Family("qwen2_vl", "<|image_pad|>", True, _qwen2_vl),
    "LlavaProcessor": Family("llava", "<image>", False, _llava, _prepare_llava),
    "LlavaNextProcessor": Family("llava_next", "<image>", True, _llava_next, _prepare_llava_next),
    "Idefics3Processor": Family("idefics3", "<image>", True, _idefics3, _prepare_idefics3, pure=False),
    "SmolVLMProcessor": Family("smolvlm", "<image>", True, _smolvlm, _prepare_smolvlm, pure=False),
}

# The families whose rows carry ``image_spans`` (an image's expansion is more than its image tokens).
SPANNED: frozenset[str] = frozenset(f.name for f in FAMILIES.values() if not f.pure)
