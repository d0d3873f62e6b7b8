"""Train a causal LM with DPO on a packcli preference output, in plain PyTorch.

    packcli pack prefs.jsonl --max-len 4096 -o packed/          # prompt/chosen/rejected records
    python examples/train_dpo.py packed/ MODEL --steps 100 --beta 0.1

MODEL is a Hugging Face model name or local directory (``--tiny`` trains a small random Llama instead,
to try the recipe without one). Every row holds whole pairs (chosen, then its rejected sample); one
forward pass over a batch of rows gives every sample's summed log-probability of its completion
(``packcli.train.dpo.sequence_logps_from_hidden``), the pairs keep apart in attention through
``position_ids`` with no attention mask and ``use_cache=False``, and the loss is averaged over the
step's pairs. The reference model is a frozen copy of the starting model, run on the very same
packed batch under ``torch.no_grad()``.

Before the first step the output is checked (``packcli.train.checks.check_compatible``): an SFT or KTO
output, a model whose input embedding is smaller than the largest packed id, or another tokenizer than
the one the output was packed with (``--tokenizer``, default the model's) is refused in one line.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from packcli.errors import PackcliError
from packcli.train.checks import RankStepSampler, check_compatible, load_rows, read_output_manifest
from packcli.train.dpo import PreferenceCollator, dpo_loss, pair_logps, sequence_logps_from_hidden


def tiny_llama(vocab_size: int, max_len: int) -> Any:
    """A small random Llama (2 layers, hidden size 32), for trying the recipe without a model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_len,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def _batches(loader: DataLoader) -> Iterator[dict[str, Any]]:
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def logps(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    """Every sample's summed log-probability of its trained tokens, from one forward pass over the batch."""
    device = next(model.parameters()).device
    hidden = model.model(
        input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device), use_cache=False
    ).last_hidden_state
    summed, _ = sequence_logps_from_hidden(hidden, model.lm_head, batch["labels"].to(device), batch["segments"])
    return summed


def train(
    directory: str | Path,
    model_name: str | None = None,
    steps: int = 100,
    batch_rows: int = 4,
    lr: float = 5e-6,
    beta: float = 0.1,
    tiny: bool = False,
    log: Callable[..., None] = print,
    tokenizer: Any = None,
) -> list[float]:
    """Run ``steps`` DPO steps on the output at ``directory``; return the loss of each step.

    Raises IncompatibleError before the model loads when the output is not preference data or
    ``tokenizer`` (a name, a directory or a tokenizer; by default the model's) is not the one it was packed
    with, and before the first step when the model's input embedding is too small for its ids.
    """
    if not tiny and tokenizer is None:
        tokenizer = model_name
    check_compatible(directory, task="preference", tokenizer=tokenizer)
    manifest = read_output_manifest(directory)
    if tiny:
        policy = tiny_llama(int(manifest["tokenizer"]["vocab_size"]), int(manifest["max_len"]))
    else:
        from transformers import AutoModelForCausalLM

        policy = AutoModelForCausalLM.from_pretrained(model_name, attn_implementation="sdpa")
    check_compatible(directory, task="preference", model=policy)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy.to(device).train()
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    rows = load_rows(directory)
    loader = DataLoader(
        rows,
        batch_size=batch_rows,
        sampler=RankStepSampler(rows, world_size=1),
        collate_fn=PreferenceCollator("padded", model=policy),  # refuses an id outside the embedding
    )
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    losses = []
    for step, batch in zip(range(steps), _batches(loader), strict=False):
        segments = batch["segments"]
        with torch.no_grad():
            ref_chosen, ref_rejected = pair_logps(logps(reference, batch), segments)
        chosen, rejected = pair_logps(logps(policy, batch), segments)
        loss, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=beta)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        accuracy = float((chosen_rewards > rejected_rewards).float().mean())
        losses.append(float(loss.detach()))
        log(f"step {step}: loss {losses[-1]:.4f}, {segments.num_pairs} pairs, reward accuracy {accuracy:.2f}")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="a packcli pack output of preference data")
    parser.add_argument("model", nargs="?", help="Hugging Face model name or directory (or --tiny)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-rows", type=int, default=4, help="packed rows per batch")
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--tiny", action="store_true", help="train a small random Llama (no model needed)")
    parser.add_argument("--tokenizer", help="the tokenizer to check the output against [default: the model's]")
    args = parser.parse_args()
    if not args.tiny and not args.model:
        parser.error("pass MODEL or --tiny")
    try:
        train(
            args.directory,
            args.model,
            args.steps,
            args.batch_rows,
            args.lr,
            args.beta,
            args.tiny,
            tokenizer=args.tokenizer,
        )
    except PackcliError as exc:
        raise SystemExit(f"Error: {exc}") from None


if __name__ == "__main__":
    main()
