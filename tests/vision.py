"""Vision-language processors built in the tests (no Hub): real image processor configurations, the
128k tokenizer with the model's vision tokens, and the model's official chat template (from trl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packcli.tokenize.tokenizer import default_tokenizer_dir
from tests.conftest import trl_templates

# Qwen2-VL-7B-Instruct's / Qwen2.5-VL-7B-Instruct's preprocessor_config.json (the image part).
QWEN2_VL_IMAGE_CONFIG: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,
}
QWEN2_VL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def make_qwen2_vl_processor(out: Path, *, max_pixels: int | None = None, training_template: bool = False) -> Path:
    """Save a Qwen2.5-VL processor directory: image processor, tokenizer with its vision tokens, template."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    config = dict(QWEN2_VL_IMAGE_CONFIG)
    if max_pixels is not None:
        config["max_pixels"] = max_pixels
    Qwen2VLImageProcessorPil(**config).save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": QWEN2_VL_TOKENS})
    tok.save_pretrained(out)
    name = "qwen2_5_vl_training.jinja" if training_template else "qwen2_5_vl.jinja"
    (out / "chat_template.jinja").write_text((trl_templates() / name).read_text(encoding="utf-8"), encoding="utf-8")
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}), encoding="utf-8")
    return out


def make_image(path: Path, width: int, height: int, *, exif_orientation: int | None = None, seed: int = 0) -> Path:
    """Write an image of this size with pixels that differ (PNG, or JPEG with an EXIF orientation)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed + width * 7919 + height)
    image = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    if exif_orientation is None:
        image.save(path)
    else:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        image.save(path, exif=exif)
    return path
