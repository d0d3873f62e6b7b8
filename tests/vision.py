"""Vision-language processors built in the tests (no Hub): real image processor configurations, the
128k tokenizer with the model's vision tokens, and the model's official chat template (from trl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packcli.tokenize.encoders.tokenizer import default_tokenizer_dir
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


# The image processors' and processors' configurations below are those of the models' Hub repositories
# (preprocessor_config.json / processor_config.json), written here from those repositories as published;
# nothing is downloaded at test time.

# llava-hf/llava-1.5-7b-hf: a CLIPImageProcessor (resize the shortest edge to 336, centre-crop 336x336).
LLAVA_IMAGE_CONFIG: dict[str, Any] = {
    "crop_size": {"height": 336, "width": 336},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 336},
}
LLAVA_PROCESSOR_CONFIG: dict[str, Any] = {
    "image_token": "<image>",
    "num_additional_image_tokens": 1,
    "patch_size": 14,
    "processor_class": "LlavaProcessor",
    "vision_feature_select_strategy": "default",
}

# llava-hf/llava-v1.6-mistral-7b-hf: a LlavaNextImageProcessor (any resolution over five grid pinpoints).
LLAVA_NEXT_IMAGE_CONFIG: dict[str, Any] = {
    **LLAVA_IMAGE_CONFIG,
    "do_pad": True,
    "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
}
LLAVA_NEXT_PROCESSOR_CONFIG: dict[str, Any] = {**LLAVA_PROCESSOR_CONFIG, "processor_class": "LlavaNextProcessor"}
LLAVA_TOKENS = ["<image>"]

# HuggingFaceM4/Idefics3-8B-Llama3: the longest edge resized to 4 x 364, split into 364-pixel tiles,
# 169 image tokens per tile (resample 1 is LANCZOS).
IDEFICS3_IMAGE_CONFIG: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 364},
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1456},
}
IDEFICS3_PROCESSOR_CONFIG: dict[str, Any] = {"image_seq_len": 169, "processor_class": "Idefics3Processor"}

# HuggingFaceTB/SmolVLM-Instruct: the same image splitting with 384-pixel tiles (longest edge 4 x 384)
# and 81 image tokens per tile. That repository names Idefics3Processor (its model is an Idefics3); the
# SmolVLM2 repositories name SmolVLMProcessor / SmolVLMImageProcessor with these values.
SMOLVLM_IMAGE_CONFIG: dict[str, Any] = {
    **IDEFICS3_IMAGE_CONFIG,
    "max_image_size": {"longest_edge": 384},
    "size": {"longest_edge": 1536},
}
SMOLVLM_PROCESSOR_CONFIG: dict[str, Any] = {"image_seq_len": 81, "processor_class": "SmolVLMProcessor"}
IDEFICS3_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *[f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)],
]

_IMAGE_PROCESSORS = {
    "LlavaProcessor": "CLIPImageProcessorPil",
    "LlavaNextProcessor": "LlavaNextImageProcessorPil",
    "Idefics3Processor": "Idefics3ImageProcessorPil",
    "SmolVLMProcessor": "SmolVLMImageProcessorPil",
}


def make_processor_dir(
    out: Path,
    image_config: dict[str, Any],
    processor_config: dict[str, Any],
    tokens: list[str],
    template: str,
) -> Path:
    """Save a processor directory: the image processor of the processor class, the 128k tokenizer with the
    model's vision tokens as special tokens, processor_config.json and the trl template ``template``."""
    import transformers
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    image_processor = getattr(transformers, _IMAGE_PROCESSORS[processor_config["processor_class"]])
    image_processor(**image_config).save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": tokens})
    tok.save_pretrained(out)
    (out / "chat_template.jinja").write_text((trl_templates() / template).read_text(encoding="utf-8"), encoding="utf-8")
    (out / "processor_config.json").write_text(json.dumps(processor_config), encoding="utf-8")
    return out


def make_llava_processor(out: Path, **changes: Any) -> Path:
    """LLaVA-1.5 (trl ships no LLaVA-1.5 template; the LLaVA-NeXT one renders the same ``<image>``)."""
    return make_processor_dir(
        out, {**LLAVA_IMAGE_CONFIG, **changes}, LLAVA_PROCESSOR_CONFIG, LLAVA_TOKENS, "llava_next.jinja"
    )


def make_llava_next_processor(out: Path, **changes: Any) -> Path:
    return make_processor_dir(
        out, {**LLAVA_NEXT_IMAGE_CONFIG, **changes}, LLAVA_NEXT_PROCESSOR_CONFIG, LLAVA_TOKENS, "llava_next.jinja"
    )


def make_idefics3_processor(out: Path, **changes: Any) -> Path:
    return make_processor_dir(
        out, {**IDEFICS3_IMAGE_CONFIG, **changes}, IDEFICS3_PROCESSOR_CONFIG, IDEFICS3_TOKENS, "idefics3.jinja"
    )


def make_smolvlm_processor(out: Path, *, processor_class: str = "SmolVLMProcessor", **changes: Any) -> Path:
    config = {**SMOLVLM_PROCESSOR_CONFIG, "processor_class": processor_class}
    return make_processor_dir(out, {**SMOLVLM_IMAGE_CONFIG, **changes}, config, IDEFICS3_TOKENS, "smolvlm.jinja")
