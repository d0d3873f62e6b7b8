"""Train DPO, KTO and reward models on packed preference shards (needs the ``torch`` extra).

A row of a preference output holds whole pairs: each record's chosen sample, then its rejected sample,
adjacent, with ``sample_role`` 1 and 2 (KTO outputs: one sample per record, role 3 desirable or 4
undesirable). ``PreferenceCollator`` batches rows as ``packcli.train.collate.PackedCollator`` does and adds a
``Segments`` description of every sample of the batch: which tokens are its, its role, and the pairs.
From one forward pass over the batch, ``sequence_logps`` gives every sample's summed log-probability
of its trained tokens (the completion) and their count; ``dpo_loss`` and ``kto_loss`` turn those into
losses averaged over pairs (or samples), never over tokens, so a long completion weighs as much as a
short one, as in the DPO and KTO objectives.

Samples must not attend to each other inside a row. Either pass the batch's ``position_ids`` (which
restart at 0 at every sample) with **no** attention mask and ``use_cache=False``: transformers (5.x,
``masking_utils.find_packed_sequence_indices``) then builds a block-diagonal causal mask for sdpa,
eager and flex attention, and flash attention uses the ``cu_seq_lens_*`` of the flatten layout. Or
build the mask yourself: ``PreferenceCollator(attention_mask=True)`` adds a 4-D block-diagonal causal
``attention_mask`` (``block_causal_mask``), which transformers passes to sdpa and eager attention as
it is (not for flash attention, which takes no such mask).

This module imports only ``packcli.train.collate`` and the output contract, not the packing pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from packcli.contract import CHOSEN, DESIRABLE, IGNORE_INDEX, REJECTED, UNDESIRABLE
from packcli.train.collate import Mode, PackedCollator


@dataclass
class Segments:
    """The samples of a collated batch (S of them, padding excluded), in batch order.

    ``token_segment`` [B, T] is the sample each token belongs to (an index into the per-sample
    tensors), -1 on padding. ``row``, ``start`` and ``length`` [S] place each sample in the batch
    (``start`` within its batch row). ``chosen`` and ``rejected`` [P] are the sample indices of the
    batch's pairs, pair k being ``(chosen[k], rejected[k])``; ``kto`` [K] the KTO samples and
    ``desirable`` [K] their labels.
    """

    token_segment: torch.Tensor
    row: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    sample_index: torch.Tensor
    role: torch.Tensor
    chosen: torch.Tensor
    rejected: torch.Tensor
    kto: torch.Tensor
    desirable: torch.Tensor

    @property
    def num_pairs(self) -> int:
        return len(self.chosen)

    def last_token(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return each sample's last token as (row, column) index tensors, e.g. for a reward head."""
        return self.row, self.start + self.length - 1


class _PreferenceRows(PackedCollator):
    """PackedCollator for the rows of a preference or KTO output (the task its manifest is checked for)."""

    TASKS = ("preference", "kto")


class PreferenceCollator:
    """Collate rows of a preference or KTO output into a model batch and its ``Segments``.

    The model inputs are ``PackedCollator(mode, pad_token_id, pad_to_multiple_of)``'s; the returned
    dict has them and ``"segments"`` (take it out before calling the model:
    ``segments = batch.pop("segments")``). With ``attention_mask=True`` the batch also holds a 4-D
    block-diagonal causal ``attention_mask`` (float, 0 where attention is allowed).

    ``output``, ``model`` and ``tokenizer`` are checked as ``PackedCollator`` checks them, except that
    the output must be of preference or KTO data: an SFT output is refused at once.

    Each row needs ``seq_lengths``, ``sample_index`` and ``sample_role`` besides the token columns.
    A pair split over two rows of the batch (which packcli never writes) is refused.
    """

    def __init__(
        self,
        mode: Mode = "padded",
        pad_token_id: int = 0,
        pad_to_multiple_of: int | None = None,
        attention_mask: bool = False,
        *,
        output: str | Path | None = None,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        self.packed = _PreferenceRows(
            mode, pad_token_id, pad_to_multiple_of, output=output, model=model, tokenizer=tokenizer
        )
        self.attention_mask = attention_mask

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch = self.packed(rows)
        width = batch["input_ids"].shape[1]
        flat = self.packed.mode == "flatten"
        token_segment = torch.full((1 if flat else len(rows), width), -1, dtype=torch.long)
        rows_of: list[int] = []
        starts: list[int] = []
        lengths: list[int] = []
        indices: list[int] = []
        roles: list[int] = []
        offset = 0
        for k, row in enumerate(rows):
            for name in ("seq_lengths", "sample_index", "sample_role"):
                if row.get(name) is None:
                    raise KeyError(
                        f"row {k} of the batch has no '{name}' column; pass rows of a preference or KTO output "
                        "(with the Trainer, set remove_unused_columns=False)"
                    )
            seq = torch.as_tensor(row["seq_lengths"], dtype=torch.long).reshape(-1)
            index = torch.as_tensor(row["sample_index"], dtype=torch.long).reshape(-1)
            role = torch.as_tensor(row["sample_role"], dtype=torch.long).reshape(-1)
            if not len(seq) == len(index) == len(role):
                raise ValueError(f"row {k} of the batch: seq_lengths, sample_index and sample_role differ in length")
            at = 0 if not flat else offset
            for n, i, r in zip(seq.tolist(), index.tolist(), role.tolist(), strict=True):
                if i >= 0:  # not a --pad-to-max padding segment
                    token_segment[0 if flat else k, at : at + n] = len(starts)
                    rows_of.append(0 if flat else k)
                    starts.append(at)
                    lengths.append(n)
                    indices.append(i)
                    roles.append(r)
                at += n
            offset += int(seq.sum())
        role_t = torch.tensor(roles, dtype=torch.long)
        index_t = torch.tensor(indices, dtype=torch.long)
        chosen = torch.nonzero(role_t == CHOSEN).reshape(-1)
        rejected = torch.nonzero(role_t == REJECTED).reshape(-1)
        paired = len(chosen) == len(rejected) and bool((rejected == chosen + 1).all())
        if not paired or not bool((index_t[chosen] == index_t[rejected]).all() if len(chosen) else True):
            raise ValueError(
                "the batch has a chosen sample without its rejected sample right after it; "
                "pass whole rows of a packcli preference output"
            )
        kto = torch.nonzero((role_t == DESIRABLE) | (role_t == UNDESIRABLE)).reshape(-1)
        segments = Segments(
            token_segment=token_segment,
            row=torch.tensor(rows_of, dtype=torch.long),
            start=torch.tensor(starts, dtype=torch.long),
            length=torch.tensor(lengths, dtype=torch.long),
            sample_index=index_t,
            role=role_t,
            chosen=chosen,
            rejected=rejected,
            kto=kto,
            desirable=role_t[kto] == DESIRABLE,
        )
        if self.attention_mask:
            batch["attention_mask"] = block_causal_mask(token_segment)
        batch["segments"] = segments
        return batch


def block_causal_mask(token_segment: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Return the 4-D additive attention mask [B, 1, T, T] that keeps every sample to itself, causally.

    0 where query t may attend key s (the same sample, s <= t), the dtype's lowest value elsewhere.
    Padding (segment -1) attends only to itself, so that no row of the mask is empty.
    """
    seg = token_segment
    width = seg.shape[-1]
    same = seg[:, :, None] == seg[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    own = torch.eye(width, dtype=torch.bool)
    allowed = (same & causal & (seg[:, :, None] >= 0)) | own
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def _targets(labels: torch.Tensor, segments: Segments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (batch row, position of the logit, target id) of every trained token, and its sample.

    Labels are unshifted: the logit at t is scored on the label at t + 1. A sample's first label is
    -100, so no logit is scored on the next sample's first token.
    """
    target = labels[:, 1:]
    rows, cols = torch.nonzero(target != IGNORE_INDEX, as_tuple=True)
    owner = segments.token_segment.to(labels.device)[rows, cols + 1]
    if bool((owner < 0).any()):
        raise ValueError("a trained label lies outside every sample of the batch; the batch and segments differ")
    return torch.stack([rows, cols]), target[rows, cols], owner


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, segments: Segments) -> tuple[torch.Tensor, torch.Tensor]:
    """Return every sample's summed log-probability of its trained tokens [S], and their count [S].

    ``logits`` [B, T, V] from one forward pass over the batch, ``labels`` [B, T] as collated.
    """
    where, target, owner = _targets(labels, segments)
    token_logits = logits[where[0], where[1]].float()
    return _per_sample(token_logits, target, owner, len(segments.role))


def sequence_logps_from_hidden(
    hidden: torch.Tensor, lm_head: torch.nn.Module, labels: torch.Tensor, segments: Segments
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequence_logps`` from the last hidden states [B, T, H], projecting only the trained positions.

    With a large vocabulary the full logits of a packed batch dominate memory; the completions are a
    fraction of the tokens. ``lm_head`` is the model's output layer (``model.lm_head``).
    """
    where, target, owner = _targets(labels, segments)
    token_logits = lm_head(hidden[where[0], where[1]]).float()
    return _per_sample(token_logits, target, owner, len(segments.role))


def _per_sample(
    token_logits: torch.Tensor, target: torch.Tensor, owner: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    token_logps = -F.cross_entropy(token_logits, target, reduction="none")
    sums = torch.zeros(n, dtype=token_logps.dtype, device=token_logps.device).index_add(0, owner, token_logps)
    counts = torch.zeros(n, dtype=torch.long, device=owner.device).index_add(0, owner, torch.ones_like(owner))
    return sums, counts


def pair_logps(logps: torch.Tensor, segments: Segments) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the chosen and the rejected samples' values of a per-sample tensor, pair by pair [P]."""
    return logps[segments.chosen.to(logps.device)], logps[segments.rejected.to(logps.device)]


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    num_pairs: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return the DPO (sigmoid) loss averaged over pairs, and the chosen and rejected rewards [P].

    loss_k = -(1 - ε) log σ(β Δ_k) - ε log σ(-β Δ_k), Δ_k = (π_c - ref_c) - (π_r - ref_r), from
    summed log-probabilities. The mean is over pairs: pass ``num_pairs``, the pairs of the whole
    optimizer step (every micro-batch, every rank), under gradient accumulation, so that each pair
    weighs the same whatever the packing put in a batch.
    """
    chosen_rewards = beta * (policy_chosen - reference_chosen)
    rejected_rewards = beta * (policy_rejected - reference_rejected)
    margin = chosen_rewards - rejected_rewards
    losses = -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)
    denominator = len(losses) if num_pairs is None else num_pairs
    return losses.sum() / denominator, chosen_rewards.detach(), rejected_rewards.detach()


def kto_loss(
    policy_logps: torch.Tensor,
    reference_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor | float | None = None,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    num_samples: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the KTO loss averaged over samples, and the rewards β (π - ref) [K].

    desirable: w_d (1 - σ(β(π - ref) - z)), undesirable: w_u (1 - σ(z - β(π - ref))), with the
    reference point z = β·kl. KTO estimates kl from completions paired with other prompts; pass it
    as ``kl`` (clamped at 0, no gradient). Without it, z is the batch's mean reward clamped at 0 and
    detached, a cruder estimate.
    """
    rewards = beta * (policy_logps - reference_logps)
    if kl is None:
        z = rewards.detach().mean().clamp(min=0)
    else:
        z = beta * torch.as_tensor(kl, dtype=rewards.dtype, device=rewards.device).detach().clamp(min=0)
    desirable = desirable.to(rewards.device)
    losses = torch.where(
        desirable,
        desirable_weight * (1 - torch.sigmoid(rewards - z)),
        undesirable_weight * (1 - torch.sigmoid(z - rewards)),
    )
    denominator = len(losses) if num_samples is None else num_samples
    return losses.sum() / denominator, rewards.detach()


def reward_loss(
    chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, num_pairs: int | torch.Tensor | None = None
) -> torch.Tensor:
    """Return the Bradley-Terry reward-model loss -log σ(r_c - r_r), averaged over pairs.

    The scores are a reward head's outputs at each sample's last token (``Segments.last_token``).
    """
    losses = -F.logsigmoid(chosen_scores - rejected_scores)
    return losses.sum() / (len(losses) if num_pairs is None else num_pairs)
