"""Train a Qwen2-VL-family model on packed image-text rows with VisionCollator and a plain PyTorch loop.

Usage (run as written on a 40-record corpus: 30 one-image conversations, images 56 to 400 pixels a
side, and 10 text-only ones; PROC_DIR a saved Qwen2.5-VL processor, here built without the Hub by
``tests/vision.py``'s ``make_qwen2_vl_processor``):

    packcli pack vl.jsonl --processor qwen_proc/ --max-len 1024 -o packed/
    python examples/train_vision.py packed/ --processor qwen_proc/ --steps 10

packed 40 records into 4 rows (3,613 tokens, fill 88.2%); the tiny random model's loss went from
11.72 at step 1 to 11.21 at step 10 (lr 1e-3, 2 rows a step).

    python examples/train_vision.py OUT/ --processor PROC_DIR --model MODEL_DIR --steps 100
    python examples/train_vision.py OUT/ --processor PROC_DIR --steps 20      # a tiny random model

OUT is a ``packcli pack ... --processor PROC_DIR`` output directory, PROC_DIR the processor it was packed
with (a saved processor: tokenizer, image processor, chat template) and MODEL_DIR a Qwen2-VL or
Qwen2.5-VL checkpoint. Without ``--model`` a tiny randomly initialised Qwen2.5-VL is built from the
processor's tokenizer: a smoke run that shows the pipeline end to end.

Each packed row holds its images by path (or their bytes) with their grids, token counts, offsets and
samples; the collator loads them, runs the image processor, checks every image's feature count against
its image tokens, and gives the model (4, B, T) positions: the text positions restarting at each sample
(from which the model builds the packed attention mask) and each sample's own mRoPE positions. No
attention mask, no cache.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from packcli.errors import PackcliError
from packcli.train.checks import RankStepSampler, load_rows as _load_rows
from packcli.train.vision import VisionCollator
from packcli.vision import load_processor

FAMILIES = ("qwen2_5_vl", "qwen2_vl")


def load_rows(shard_dir: str | Path, cache_dir: str | None = None) -> Any:
    """Return the packed rows of a ``packcli pack`` output directory as a Dataset (SFT outputs only)."""
    return _load_rows(shard_dir, cache_dir=cache_dir, task="sft")


def tiny_model(
    processor_dir: str | Path,
    *,
    family: str = "qwen2_5_vl",
    attn: str = "sdpa",
    initializer_range: float = 0.02,
    seed: int = 0,
) -> Any:
    """Return a tiny randomly initialised Qwen2.5-VL (or Qwen2-VL) for the processor's tokenizer.

    Two text layers of width 32, a two-block vision tower of width 32; the vocabulary is the tokenizer's,
    the vision token ids are the tokenizer's, the patch and merge sizes the image processor's.
    """
    from transformers import (
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration as Qwen2VL,
    )

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, not {family!r}")
    processor = load_processor(str(processor_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(processor_dir))
    token = tokenizer.convert_tokens_to_ids
    image = processor.image_processor
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "initializer_range": initializer_range,
        "use_cache": False,
        # head_dim 8: 4 rotary frequencies, split 2/1/1 over the temporal, height and width positions.
        "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0},
        "bos_token_id": None,
        "eos_token_id": token("<|im_end|>"),
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision: dict[str, Any] = {
        "depth": 2,
        "num_heads": 2,
        "patch_size": image.patch_size,
        "spatial_merge_size": image.merge_size,
        "temporal_patch_size": image.temporal_patch_size,
        "initializer_range": initializer_range,
    }
    if family == "qwen2_5_vl":
        vision |= {"hidden_size": 32, "intermediate_size": 64, "out_hidden_size": 32}
        vision |= {"window_size": 2 * image.patch_size * image.merge_size, "fullatt_block_indexes": [1]}
    else:
        vision |= {"embed_dim": 32, "hidden_size": 32, "mlp_ratio": 2}
    ids = {
        "image_token_id": token("<|image_pad|>"),
        "video_token_id": token("<|video_pad|>"),
        "vision_start_token_id": token("<|vision_start|>"),
        "vision_end_token_id": token("<|vision_end|>"),
    }
    config_class, model_class = (
        (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration) if family == "qwen2_5_vl" else (Qwen2VLConfig, Qwen2VL)
    )
    config = config_class(text_config=text, vision_config=vision, attn_implementation=attn, **ids)
    torch.manual_seed(seed)
    return model_class(config).float()


def _cycle(loader: DataLoader) -> Iterator[dict[str, Any]]:
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)  # a new order of rows each epoch
        yield from loader
        epoch += 1


def train(
    model: torch.nn.Module,
    rows: Sequence[dict[str, Any]] | Any,
    processor: str | Path,
    *,
    steps: int,
    mode: str = "flatten",
    batch_size: int = 2,
    lr: float = 1e-5,
    pad_token_id: int = 0,
    max_grad_norm: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """Run ``steps`` optimizer steps over packed image-text ``rows``; return the loss of each step."""
    device = next(model.parameters()).device
    model.config.use_cache = False  # with a cache, transformers ignores the packed positions
    model.train()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    sampler = RankStepSampler(rows, world, rank=rank if world > 1 else None, seed=seed)
    # The collator checks the model's image token id and merge size against the processor at once, and
    # each image's features against its tokens in every batch.
    collate = VisionCollator(processor, mode, pad_token_id=pad_token_id, model=model)
    loader = DataLoader(rows, batch_size=batch_size, sampler=sampler, collate_fn=collate)
    optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=lr)
    losses: list[float] = []
    batches = _cycle(loader)
    for _ in range(steps):
        batch = next(batches)
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        loss = model(**batch, use_cache=False).loss  # the mean over the batch's trained tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="packcli pack --processor output directory")
    parser.add_argument("--processor", required=True, help="the processor directory the output was packed with")
    parser.add_argument("--model", help="a Qwen2-VL-family model directory [default: a tiny random Qwen2.5-VL]")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--mode", choices=["flatten", "padded"], default="flatten")
    parser.add_argument("--batch-size", type=int, default=2, help="packed rows per step")
    parser.add_argument("--lr", type=float, default=None, help="[default: 1e-5, 1e-3 for the tiny model]")
    parser.add_argument("--attn", default="sdpa", help="sdpa, eager, flex_attention, flash_attention_2 (flatten)")
    parser.add_argument("--output-dir", help="save the trained model here")
    args = parser.parse_args(argv)
    if args.attn.startswith("flash") and args.mode != "flatten":
        parser.error("flash attention keeps samples apart only in --mode flatten")
    try:
        rows = load_rows(args.shards)
        if args.model:
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_pretrained(args.model, attn_implementation=args.attn)
        else:
            model = tiny_model(args.processor, attn=args.attn)
        model.to("cuda" if torch.cuda.is_available() else "cpu")
        pad = model.config.get_text_config().pad_token_id
        lr = args.lr if args.lr is not None else (1e-5 if args.model else 1e-3)
        losses = train(
            model,
            rows,
            args.processor,
            steps=args.steps,
            mode=args.mode,
            batch_size=args.batch_size,
            lr=lr,
            pad_token_id=pad if pad is not None else 0,
        )
    except PackcliError as exc:
        raise SystemExit(f"Error: {exc}") from None
    for step, loss in enumerate(losses, 1):
        print(f"step {step} loss {loss:.4f}")
    if not all(math.isfinite(x) for x in losses):
        raise SystemExit("the loss is not finite")
    if args.output_dir:
        model.save_pretrained(args.output_dir)


if __name__ == "__main__":
    main()
