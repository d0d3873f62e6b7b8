"""Train a causal LM on packcli shards with a plain PyTorch loop and PackedCollator.

    python examples/train_torch_loop.py OUT/ MODEL --steps 100 --mode flatten

OUT is a ``packcli pack`` output directory and MODEL a Hugging Face model name or local directory.
Each sample in a packed row sees only its own tokens: the batch carries per-sample ``position_ids``,
no attention mask, and the model runs with ``use_cache=False``.

Before the first step the output is checked against the recipe, the model and the tokenizer
(``packcli.train.checks.check_compatible``): a preference output, a model whose input embedding is smaller
than the largest packed id, or another tokenizer than the one the output was packed with is refused in
one line.

Under ``torchrun --nproc-per-node N`` (an output packed with ``--world-size N``), each rank reads its
own rows with ``RankStepSampler(rows, N, rank=RANK)``: whole steps shuffled each epoch, one row of
each step per rank, as the packing balanced them. Parquet and Arrow outputs are both read.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from torch.utils.data import DataLoader

from packcli.errors import PackcliError
from packcli.train.checks import RankStepSampler, check_compatible, load_rows as _load_rows
from packcli.train.collate import PackedCollator


def load_rows(
    shard_dir: str | Path, cache_dir: str | None = None, *, model: Any = None, tokenizer: Any = None
) -> Dataset:
    """Return the packed rows of a ``packcli pack`` output directory (Parquet or Arrow) as a Dataset.

    Refuses (IncompatibleError) an output that is not SFT data, and the ``model`` and ``tokenizer`` when
    given and they do not fit it.
    """
    return _load_rows(shard_dir, cache_dir=cache_dir, task="sft", model=model, tokenizer=tokenizer)


def _cycle(loader: DataLoader) -> Iterator[dict[str, Any]]:
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)  # a new order of steps each epoch
        yield from loader
        epoch += 1


def train(
    model: torch.nn.Module,
    rows: Dataset,
    *,
    steps: int,
    mode: str = "flatten",
    batch_size: int = 4,
    lr: float = 1e-5,
    pad_token_id: int = 0,
    max_grad_norm: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """Run ``steps`` optimizer steps over ``rows`` and return the loss of each step."""
    device = next(model.parameters()).device
    model.config.use_cache = False  # with a cache, transformers ignores the packed position_ids
    model.train()
    # One process: a seeded shuffle of the rows. Under torchrun: this rank's rows, one of each step.
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    sampler = RankStepSampler(rows, world, rank=rank if world > 1 else None, seed=seed)
    # Given the model, the collator refuses a batch id outside its input embedding (not an IndexError in torch).
    collate = PackedCollator(mode, pad_token_id=pad_token_id, model=model)
    loader = DataLoader(rows, batch_size=batch_size, sampler=sampler, collate_fn=collate)
    optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=lr)
    losses: list[float] = []
    batches = _cycle(loader)
    for _ in range(steps):
        batch = next(batches)
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        # The loss is the mean over the batch's trained tokens; labels are unshifted, the model shifts them.
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="packcli pack output directory")
    parser.add_argument("model", help="Hugging Face model name or local directory")
    parser.add_argument("--tokenizer", help="the tokenizer to check the output against [default: the model's]")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--mode", choices=["flatten", "padded"], default="flatten")
    parser.add_argument("--batch-size", type=int, default=4, help="packed rows per step")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--attn", default="sdpa", help="sdpa, eager, flex_attention, flash_attention_2 (flatten only)")
    parser.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16")
    parser.add_argument("--output-dir", help="save the trained model here")
    args = parser.parse_args(argv)
    if args.attn.startswith("flash") and args.mode != "flatten":
        parser.error("flash attention keeps samples apart only in --mode flatten")

    from transformers import AutoModelForCausalLM

    try:
        # The task and the tokenizer are checked before the model loads, the model's embedding after.
        rows = load_rows(args.shards, tokenizer=args.tokenizer or args.model)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
        model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation=args.attn, dtype=dtype)
        check_compatible(args.shards, model=model)
    except PackcliError as exc:
        raise SystemExit(f"Error: {exc}") from None
    model.to(device)
    pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    losses = train(
        model,
        rows,
        steps=args.steps,
        mode=args.mode,
        batch_size=args.batch_size,
        lr=args.lr,
        pad_token_id=pad_token_id,
    )
    for step, loss in enumerate(losses, 1):
        print(f"step {step} loss {loss:.4f}")
    if not all(math.isfinite(x) for x in losses):
        raise SystemExit("the loss is not finite")
    if args.output_dir:
        model.save_pretrained(args.output_dir)


if __name__ == "__main__":
    main()
