"""A vision-language processor as packcli uses it: its image processor, chat template and image rule.

``load_processor(NAME_OR_DIR)`` reads a saved processor (``save_pretrained``: tokenizer files, image
processor config, chat template, ``processor_config.json``) and picks its family by the processor class
it names. Each family answers one question, ``measure(height, width)``: how many tokens an image of that
size becomes and the text that replaces its placeholder, computed by the image processor's own
functions (``get_number_of_image_patches``, ``smart_resize``...) from the size alone. The image
processor is loaded with the PIL backend, so packing needs neither torchvision nor PyTorch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packcli.errors import RecordError, TokenizerError, first_line


@dataclass(frozen=True)
class ImageTokens:
    """What one image becomes in the token sequence.

    ``count`` image tokens (the placeholder token repeated, which the model fills with the image's
    features); ``text`` replaces the image's placeholder in the rendered conversation (for most
    families ``image_token * count``; Idefics3 adds row/column markers); ``grid`` is the image's size
    parameters as the model takes them (Qwen2-VL: ``image_grid_thw``; empty where there are none).
    """

    count: int
    text: str
    grid: tuple[int, ...] = ()


@dataclass
class VisionProcessor:
    """A loaded processor: chat template, image processor, and its family's image rule."""

    name: str
    family: str
    image_processor: Any
    chat_template: str | None
    image_token: str
    # True: an image's token count depends on its size (read from the header); False: it is fixed.
    needs_size: bool
    rule: Callable[[VisionProcessor, int, int], ImageTokens] = field(repr=False)
    config: dict[str, Any] = field(default_factory=dict, repr=False)

    def measure(self, height: int, width: int) -> ImageTokens:
        """Return what an image of this size becomes, or raise RecordError when the processor refuses it."""
        try:
            return self.rule(self, height, width)
        except ValueError as exc:  # e.g. Qwen2-VL's aspect ratio over 200
            raise RecordError(
                "image_refused",
                f"the {self.family} image processor refuses a {width}x{height} image: {first_line(exc)}",
            ) from None

    def token_id(self, tokenizer: Any) -> int:
        """Return the id of the image token in the processor's tokenizer (loaded by the caller from ``name``)."""
        token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise TokenizerError(
                f"processor '{self.name}': its tokenizer has no {self.image_token} token; add it as a special token"
            )
        return int(token_id)

    def identity(self) -> str:
        """Return a hash of everything that decides the image tokens (it goes into the cache key)."""
        parts = {
            "family": self.family,
            "image_processor": json.loads(self.image_processor.to_json_string()),
            "processor": self.config,
            "image_token": self.image_token,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _qwen2_vl(proc: VisionProcessor, height: int, width: int) -> ImageTokens:
    """Qwen2-VL / Qwen2.5-VL: dynamic resolution, (height, width) resized to 28-pixel units.

    The count is the image processor's ``get_number_of_image_patches`` over ``merge_size**2``, as
    ``Qwen2VLProcessor`` expands ``<|image_pad|>`` (``image_grid_thw.prod() // merge_size**2``); the grid
    is the image processor's own ``smart_resize`` in patches, one temporal patch per image.
    """
    import importlib

    ip = proc.image_processor
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
    return ImageTokens(count, proc.image_token * count, grid)


# Processor class (as processor_config.json names it) -> (family, image token default, needs size, rule).
FAMILIES: dict[str, tuple[str, str, bool, Callable[[VisionProcessor, int, int], ImageTokens]]] = {
    "Qwen2VLProcessor": ("qwen2_vl", "<|image_pad|>", True, _qwen2_vl),
    "Qwen2_5_VLProcessor": ("qwen2_vl", "<|image_pad|>", True, _qwen2_vl),
}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {path}: {first_line(exc)}; check the processor directory") from None
    return data if isinstance(data, dict) else {}


def processor_files(directory: Path) -> tuple[str | None, dict[str, Any], str | None]:
    """Return the processor class a saved processor names, its processor config, and its chat template."""
    config: dict[str, Any] = {}
    cls: str | None = None
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        path = directory / name
        if path.is_file():
            data = _read_json(path)
            if name == "processor_config.json":
                config = data
            cls = cls or data.get("processor_class")
    template: str | None = None
    if (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    elif (directory / "chat_template.json").is_file():
        template = _read_json(directory / "chat_template.json").get("chat_template")
    elif isinstance(config.get("chat_template"), str):
        template = config["chat_template"]
    config = {k: v for k, v in config.items() if k not in ("chat_template", "processor_class")}
    return cls, config, template


def load_processor(name: str) -> VisionProcessor:
    """Load a saved processor directory, or raise a one-line TokenizerError naming what it lacks.

    The tokenizer is the same directory's, loaded by the caller (``packcli.tokenize.tokenizer``); the chat
    template is the processor's (``chat_template.jinja``, ``chat_template.json`` or processor_config.json),
    None when it has none (then the tokenizer's own).
    """
    directory = Path(name)
    if not directory.is_dir():
        raise TokenizerError(
            f"cannot load processor '{name}': no such directory; save it with processor.save_pretrained(DIR) "
            "(or its tokenizer and image processor) and pass DIR"
        )
    cls, config, template = processor_files(directory)
    if cls is None:
        raise TokenizerError(
            f"cannot load processor '{name}': no processor_class in processor_config.json or "
            "preprocessor_config.json; save the processor with save_pretrained"
        )
    if cls not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise TokenizerError(f"processor '{name}' is a {cls}, which packcli does not know; known: {known}")
    family, default_token, needs_size, rule = FAMILIES[cls]
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import AutoImageProcessor

    try:
        image_processor = AutoImageProcessor.from_pretrained(str(directory), backend="pil")
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for one failure
        raise TokenizerError(
            f"cannot load the image processor of '{name}': {first_line(exc)}; check the directory"
        ) from None
    token = str(config.get("image_token") or default_token)
    return VisionProcessor(
        name=name,
        family=family,
        image_processor=image_processor,
        chat_template=template,
        image_token=token,
        needs_size=needs_size,
        rule=rule,
        config=config,
    )
