"""Train a causal LM on packcli shards with the Hugging Face Trainer and PackedCollator.

    python examples/train_hf_trainer.py OUT/ MODEL --output-dir run/ --epochs 1 --mode flatten

OUT is a ``packcli pack`` output directory and MODEL a Hugging Face model name or local directory.
``remove_unused_columns=False`` keeps the shard columns the collator needs (the Trainer would drop
``position_ids`` and ``seq_lengths`` otherwise). The Trainer runs the model with ``use_cache=False``
(``TrainingArguments.use_cache`` defaults to False), which the packed-sequence path requires.

On several GPUs (``torchrun --nproc-per-node N`` or ``accelerate launch``) of an output packed with
``--world-size N``, :class:`PackedTrainer` shuffles whole steps of N rows instead of rows, so every
rank still reads rows of the same size at the same step (the Trainer's own shuffle would undo that).
Parquet and Arrow outputs are both read (``packcli.train.checks.load_rows``). Before training, the output is
checked against the recipe (SFT), the model's input embedding and the tokenizer
(``packcli.train.checks.check_compatible``), each mismatch refused in one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedModel, Trainer, TrainingArguments

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


class PackedTrainer(Trainer):
    """A Trainer whose sampler keeps ``--world-size`` balancing: whole steps shuffled, one row per rank."""

    def _get_train_sampler(self, train_dataset: Any = None) -> RankStepSampler:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return RankStepSampler(len(dataset), self.args.world_size, self.args.per_device_train_batch_size, seed=seed)


def build_trainer(
    model: PreTrainedModel,
    rows: Dataset,
    output_dir: str | Path,
    *,
    mode: str = "flatten",
    pad_token_id: int = 0,
    **training_args: Any,
) -> Trainer:
    """Return a Trainer over the packed ``rows``; ``training_args`` go to TrainingArguments."""
    args = TrainingArguments(output_dir=str(output_dir), remove_unused_columns=False, **training_args)
    return PackedTrainer(
        model=model,
        args=args,
        train_dataset=rows,
        # Given the model, the collator refuses a batch id outside its input embedding.
        data_collator=PackedCollator(mode, pad_token_id=pad_token_id, model=model),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="packcli pack output directory")
    parser.add_argument("model", help="Hugging Face model name or local directory")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--tokenizer", help="the tokenizer to check the output against [default: the model's]")
    parser.add_argument("--mode", choices=["flatten", "padded"], default="flatten")
    parser.add_argument("--batch-size", type=int, default=4, help="packed rows per device and step")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=-1, help="overrides --epochs when positive")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--attn", default="sdpa", help="sdpa, eager, flex_attention, flash_attention_2 (flatten only)")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    if args.attn.startswith("flash") and args.mode != "flatten":
        parser.error("flash attention keeps samples apart only in --mode flatten")

    from transformers import AutoModelForCausalLM

    try:
        # The task and the tokenizer are checked before the model loads, the model's embedding after.
        rows = load_rows(args.shards, tokenizer=args.tokenizer or args.model)
        model = AutoModelForCausalLM.from_pretrained(
            args.model, attn_implementation=args.attn, dtype=torch.bfloat16 if args.bf16 else torch.float32
        )
        check_compatible(args.shards, model=model)
    except PackcliError as exc:
        raise SystemExit(f"Error: {exc}") from None
    pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    trainer = build_trainer(
        model,
        rows,
        args.output_dir,
        mode=args.mode,
        pad_token_id=pad_token_id,
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        bf16=args.bf16,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
    )
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
