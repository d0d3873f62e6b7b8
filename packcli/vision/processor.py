"""A vision-language processor as packcli uses it: its image processor, chat template and image rule.

``load_processor(NAME_OR_DIR)`` reads a saved processor (``save_pretrained``: tokenizer files, image
processor config, chat template, ``processor_config.json``) and picks its family by the processor class
it names (``packcli.vision.families.FAMILIES``). Each family answers one question, ``measure(height,
width)``: how many tokens an image of that size becomes and the text that replaces its placeholder, asked
of the processor class where it constructs here, else of the image processor's and the processor
module's own functions, from the size alone. The image processor is loaded with the PIL backend, so
packing needs no torchvision.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packcli.contract import missing_tokenizer
from packcli.errors import Opt, RecordError, TokenizerError, first_line
from packcli.jsontypes import JSONObject
from packcli.vision.families import FAMILIES, ImageTokens, Rule

__all__ = ["FAMILIES", "ImageTokens", "VisionProcessor", "load_processor", "processor_files"]


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
    rule: Rule = field(repr=False)
    config: JSONObject = field(default_factory=dict, repr=False)
    # The processor class built from the directory where it constructs here (its functions answer the
    # rule), or the parts of it the rule reads; None for a family whose rule needs neither.
    processor: Any = field(default=None, repr=False)
    # False: the family is measured but not packed (Family.packs); its images are refused.
    packs: bool = True
    # False: an image's expansion is more than a run of image tokens (Family.pure); rows carry image_spans.
    pure: bool = True

    def check_packable(self) -> None:
        """Raise a one-line TokenizerError when this family's images are not packed (Family.packs)."""
        if not self.packs:
            raise TokenizerError(
                f"packcli measures {self.family} images exactly but does not pack them yet; processor "
                f"'{self.name}' packs text-only data, or use a processor of a family that packs images"
            )

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


def _read_json(path: Path) -> JSONObject:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {path}: {first_line(exc)}; check the processor directory") from None
    return data if isinstance(data, dict) else {}


def processor_files(directory: Path) -> tuple[str | None, JSONObject, str | None]:
    """Return the processor class a saved processor names, its processor config, and its chat template."""
    config: JSONObject = {}
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


def _require_pillow(name: str) -> None:
    """Refuse in one whole line when Pillow is missing (transformers' own message is several lines long)."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise TokenizerError(
            f"cannot load the image processor of '{name}': it reads images with Pillow, which is not installed; "
            "install it with pip install pillow"
        ) from None


def load_processor(name: str) -> VisionProcessor:
    """Load a saved processor directory, or raise a one-line TokenizerError naming what it lacks.

    The tokenizer is the same directory's, loaded by the caller (``packcli.tokenize.encoders.tokenizer``); the families
    whose processor class is built here (LLaVA, LLaVA-NeXT, Idefics3) load their own copy for it. The chat
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
    family = FAMILIES[cls]
    missing = missing_tokenizer(directory)
    if missing is not None:  # the processor's tokenizer is its directory's (the run's tokenizer)
        raise TokenizerError(
            f"cannot load the tokenizer of processor '{name}': {missing}",
            hint=(
                "save the processor with processor.save_pretrained (which writes its tokenizer too) and pass "
                "that directory as ",
                Opt("processor"),
            ),
        )
    _require_pillow(name)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import AutoImageProcessor

    try:
        image_processor = AutoImageProcessor.from_pretrained(str(directory), backend="pil")
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for one failure
        raise TokenizerError(
            f"cannot load the image processor of '{name}': {first_line(exc)}; check the directory"
        ) from None
    held = family.prepare(directory, image_processor, config) if family.prepare is not None else None
    token = str(getattr(held, "image_token", None) or config.get("image_token") or family.image_token)
    processor = VisionProcessor(
        name=name,
        family=family.name,
        image_processor=image_processor,
        chat_template=template,
        image_token=token,
        needs_size=family.needs_size,
        rule=family.rule,
        config=config,
        processor=held,
        packs=family.packs,
        pure=family.pure,
    )
    try:  # one image now, so that a processor whose functions do not answer fails here, not mid-run
        processor.rule(processor, 336, 336)
    except Exception as exc:  # any failure of the processor's own code on a plain size
        raise TokenizerError(
            f"processor '{name}' ({cls}) cannot measure a 336x336 image: {first_line(exc)}; check its configuration"
        ) from None
    return processor
