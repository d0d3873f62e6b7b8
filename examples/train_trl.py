"""Train a causal LM on packcli shards with TRL's SFTTrainer, padding-free (needs ``pip install trl``).

    python examples/train_trl.py OUT/ MODEL --output-dir run/ --epochs 1

OUT is a ``packcli pack`` output directory and MODEL a Hugging Face model name or local directory
(its tokenizer is loaded too, unless --tokenizer names another; use the one the shards were packed with).

The shards are already tokenized, labelled and packed, so TRL's dataset preparation is skipped and its
padding-free collator is used: it concatenates the batch's rows into one sequence, rebuilds the
per-sample ``position_ids`` from ``seq_lengths``, keeps ``labels`` as they are, and passes the
flash-attention sample boundaries (``cu_seq_lens_*``) with no attention mask. SFTTrainer refuses a
custom collator in padding-free mode, so PackedCollator is not used here; on packcli rows both make the
same batch (TRL adds ``seq_idx``, which only linear-attention layers read). TRL's collator knows nothing of
packcli, so the output is checked before training (``packcli.train.checks.check_compatible``): a preference
output, a model whose input embedding is smaller than the largest packed id, or another tokenizer than the
one the output was packed with is refused in one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from datasets import Dataset

from packcli.errors import PackcliError
from packcli.train.checks import check_compatible, load_rows as _load_rows

COLUMNS = ["input_ids", "labels", "seq_lengths"]


def load_rows(shard_dir: str | Path, *, model: Any = None, tokenizer: Any = None) -> Dataset:
    """Return the packed rows with the columns SFTTrainer's padding-free collator reads.

    Refuses (IncompatibleError) an output that is not SFT data (selecting these columns would drop the
    roles that tell a rejected answer), and the ``model`` and ``tokenizer`` when given and they do not fit it.
    """
    rows = _load_rows(shard_dir, task="sft", model=model, tokenizer=tokenizer)  # Parquet or Arrow output
    return rows.select_columns(COLUMNS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="packcli pack output directory")
    parser.add_argument("model", help="Hugging Face model name or local directory")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--tokenizer", help="tokenizer name or directory [default: the model's]")
    parser.add_argument("--batch-size", type=int, default=4, help="packed rows per device and step")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=-1, help="overrides --epochs when positive")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--attn", default="sdpa", help="attention implementation, e.g. flash_attention_2")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(
        output_dir=args.output_dir,
        # The rows are packed already: no TRL packing, no truncation, no preparation.
        packing=False,
        padding_free=True,
        max_length=None,
        dataset_kwargs={"skip_prepare_dataset": True},
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        bf16=args.bf16,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
    )
    try:
        # The task and the tokenizer are checked before the model loads, the model's embedding after.
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
        rows = load_rows(args.shards, tokenizer=tokenizer)
        model = AutoModelForCausalLM.from_pretrained(
            args.model, attn_implementation=args.attn, dtype=torch.bfloat16 if args.bf16 else torch.float32
        )
        check_compatible(args.shards, model=model)
    except PackcliError as exc:
        raise SystemExit(f"Error: {exc}") from None
    trainer = SFTTrainer(model=model, args=config, train_dataset=rows, processing_class=tokenizer)
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
