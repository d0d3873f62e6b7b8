"""Turn packed shard rows into torch batches for causal-LM training (needs the ``torch`` extra).

A shard row holds several samples back to back: ``input_ids``, unshifted ``labels`` (-100 on every
sample's first token and wherever the sample is not trained), ``position_ids`` restarting at 0 at each
sample, and ``seq_lengths``. Two batch layouts keep the samples independent in attention:

``flatten`` (padding-free)
    The batch's rows are concatenated into one sequence of shape [1, T]. Besides ``input_ids``,
    ``labels`` and ``position_ids`` it yields the varlen kwargs of flash attention: ``cu_seq_lens_q``
    and ``cu_seq_lens_k`` (int32 sample boundaries, starting with 0 and ending with T) and
    ``max_length_q`` / ``max_length_k`` (ints). Works with every attention implementation; it is the
    only layout that keeps samples apart under ``flash_attention_2``/``_3``, which ignore
    ``position_ids`` when the batch has more than one row.

``padded``
    Rows are right-padded to the longest row of the batch, shape [B, T]. Padding is one extra segment
    at the end of a row: ``input_ids`` = ``pad_token_id``, ``labels`` = -100 and ``position_ids``
    counting 0, 1, 2, ... again. transformers (sdpa, eager, flex) builds the attention mask from
    ``position_ids`` when no attention mask and no cache is given: every place where the position does
    not grow by exactly one starts a new sequence, so the padding's restart at 0 makes it a sequence of
    its own, never attended to by a real token and never trained on.

Rows packed with ``--pad-to-multiple-of`` (or ``--context-parallel``) carry ``seq_lengths_unpadded``:
each sample is padded inside its own segment, so ``seq_lengths``, ``position_ids`` and
``cu_seq_lens_q``/``_k`` describe the padded samples (what attention runs on), and flatten mode adds
``cu_seq_lens_unpadded``, the real boundaries (Transformer Engine's ``cu_seqlens`` beside
``cu_seqlens_padded``; padding segments count 0 real tokens). Rows packed with ``--loss-weighting``
carry ``loss_weights``: both layouts pass them on as a float32 ``loss_weights`` tensor (0 in the
padding) for ``weighted_loss``; take it out of the batch before calling the model.

Rows of an output packed as prefix trees (docs/guides/trees.md) carry ``tree_node_lengths`` and
``tree_node_parents``: a token attends only to its own node and its ancestors, which ``position_ids``
cannot say. ``padded`` mode then adds a 4-D ``attention_mask`` [B, 1, T, T] that transformers passes
to attention as it is (sdpa and eager): 0 where a token may attend, the mask dtype's minimum elsewhere,
the padding a causal segment of its own. ``flatten`` mode refuses tree rows: its varlen kwargs would
let a branch attend to its siblings.

Otherwise neither layout returns an ``attention_mask``: transformers only looks for packed sequences in
``position_ids`` when the attention mask is None, so even an all-ones mask would make every sample
attend to the samples before it in the row. The model must also run with ``use_cache=False``: with a
cache present the packed-sequence detection is skipped too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch

from packcli.contract import IGNORE_INDEX, TREE_COLUMNS, tree_attention
from packcli.errors import IncompatibleError, UsageError
from packcli.train.checks import check_compatible, embedding_size

Mode = Literal["flatten", "padded"]
MODES: tuple[str, ...] = ("flatten", "padded")


class PackedCollator:
    """Collate packed rows (mappings with the shard columns) into one model-ready batch.

    Args:
        mode: ``"flatten"`` (one [1, T] sequence with flash-attention varlen kwargs) or ``"padded"``
            ([B, T], rows right-padded to the longest one).
        pad_token_id: token id written into padding positions (they are never trained on).
        pad_to_multiple_of: round T up to a multiple of this (both modes). The padding follows the rule
            above; in flatten mode it is also its own entry in ``cu_seq_lens``.
        output: the ``packcli pack`` output directory the rows come from: its manifest is checked at once
            (``packcli.train.checks.check_compatible``): an output of preference or KTO data is refused, and
            so are ``model`` and ``tokenizer`` when given and they do not fit it.
        model: the model trained (or its number of input embeddings): ``pad_token_id`` and, in every
            batch, each token id must be below its input embedding size (IncompatibleError otherwise,
            never an IndexError inside torch).
        tokenizer: the tokenizer the training uses, checked against ``output``'s.
        mask_dtype: the dtype of the 4-D attention mask of tree rows (padded mode); by default the
            model's dtype when ``model`` is given (eager attention adds the mask to its scores), else float32.
            ``torch.bool`` gives the boolean form (True where a token may attend), which sdpa takes in a
            quarter of the memory of float32 and eager attention does not.

    Each row needs ``input_ids``, ``labels`` and ``position_ids``; ``seq_lengths`` is used for the
    sample boundaries when present, otherwise they are read from where ``position_ids`` is 0.
    ``seq_lengths_unpadded`` and ``loss_weights`` are passed on when every row of the batch has them;
    ``tree_node_lengths`` and ``tree_node_parents`` become the attention mask (padded mode only).
    A row with chosen, rejected or KTO samples (``sample_role`` above 0) is refused: SFT on it would
    train every answer. Other columns (``sample_index``) are ignored. Values may be lists, numpy arrays
    or tensors.
    """

    TASKS: tuple[str, ...] = ("sft",)  # the tasks whose rows it collates

    def __init__(
        self,
        mode: Mode = "flatten",
        pad_token_id: int = 0,
        pad_to_multiple_of: int | None = None,
        *,
        output: str | Path | None = None,
        model: Any = None,
        tokenizer: Any = None,
        mask_dtype: torch.dtype | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive integer, not {pad_to_multiple_of}")
        self.mode = mode
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of
        model_dtype = getattr(model, "dtype", None)
        default = model_dtype if isinstance(model_dtype, torch.dtype) and model_dtype.is_floating_point else None
        self.mask_dtype = mask_dtype or default or torch.float32
        self.compatibility = None
        if output is not None:
            self.compatibility = check_compatible(
                output, task=self.TASKS, model=model, tokenizer=tokenizer, trees=mode == "padded"
            )
        elif tokenizer is not None:
            raise UsageError("a tokenizer is checked against an output's manifest: pass output= too")
        self.embedding_size = None if model is None else embedding_size(model)
        if self.embedding_size is not None and not 0 <= self.pad_token_id < self.embedding_size:
            raise IncompatibleError(
                f"pad_token_id {self.pad_token_id} is not an id of the model's input embedding "
                f"(0 to {self.embedding_size - 1}); pass the model's pad or eos token id"
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(mode={self.mode!r}, pad_token_id={self.pad_token_id}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of})"
        )

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Return the batch of ``rows``: tensors of dtype int64, plus the varlen kwargs in flatten mode."""
        if len(rows) == 0:
            raise ValueError("cannot collate an empty batch")
        if "sft" in self.TASKS:
            _refuse_roles(rows)
        if self.mode == "flatten" and any(row.get(c) is not None for row in rows for c in TREE_COLUMNS):
            raise IncompatibleError(
                "the batch holds prefix-tree rows (tree_node_lengths), whose branches would attend to each other "
                'under flatten mode\'s varlen kwargs; collate them with PackedCollator("padded")'
            )
        parsed = [_parse_row(row, k) for k, row in enumerate(rows)]
        columns = (("unpadded", "seq_lengths_unpadded"), ("weights", "loss_weights"), ("tree", TREE_COLUMNS[0]))
        for name, column in columns:
            having = [getattr(r, name) is not None for r in parsed]
            if any(having) and not all(having):
                raise ValueError(
                    f"some rows of the batch have a '{column}' column and some do not; batch rows of one output"
                )
        batch = self._flatten(parsed) if self.mode == "flatten" else self._padded(parsed)
        if self.embedding_size is not None and batch["input_ids"].numel():
            largest = int(batch["input_ids"].max())
            if largest >= self.embedding_size:
                raise IncompatibleError(
                    f"the batch holds token id {largest}, but the model's input embedding has "
                    f"{self.embedding_size} rows; train a model of the tokenizer the output was packed with"
                )
        return batch

    def _round(self, length: int) -> int:
        m = self.pad_to_multiple_of
        return length if m is None else -(-length // m) * m

    def _flatten(self, parsed: list[_Row]) -> dict[str, Any]:
        ids = torch.cat([r.input_ids for r in parsed])
        labels = torch.cat([r.labels for r in parsed])
        positions = torch.cat([r.position_ids for r in parsed])
        lengths = torch.cat([r.seq_lengths for r in parsed])
        # Every row has these columns or none has (checked in __call__).
        has_unpadded, has_weights = parsed[0].unpadded is not None, parsed[0].weights is not None
        unpadded = torch.cat([r.unpadded for r in parsed if r.unpadded is not None]) if has_unpadded else None
        weights = torch.cat([r.weights for r in parsed if r.weights is not None]) if has_weights else None
        pad = self._round(len(ids)) - len(ids)
        if pad:
            ids = torch.cat([ids, torch.full((pad,), self.pad_token_id, dtype=torch.long)])
            labels = torch.cat([labels, torch.full((pad,), IGNORE_INDEX, dtype=torch.long)])
            positions = torch.cat([positions, torch.arange(pad, dtype=torch.long)])
            lengths = torch.cat([lengths, torch.tensor([pad], dtype=torch.long)])
            if unpadded is not None:
                unpadded = torch.cat([unpadded, torch.zeros(1, dtype=torch.long)])
            if weights is not None:
                weights = torch.cat([weights, torch.zeros(pad, dtype=torch.float32)])
        cu_seq_lens = _cumulative(lengths)
        max_length = int(lengths.max())
        extra: dict[str, Any] = {}
        if unpadded is not None:
            extra["cu_seq_lens_unpadded"] = _cumulative(unpadded)
        if weights is not None:
            extra["loss_weights"] = weights.unsqueeze(0)
        return {
            "input_ids": ids.unsqueeze(0),
            "labels": labels.unsqueeze(0),
            "position_ids": positions.unsqueeze(0),
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens.clone(),
            "max_length_q": max_length,
            "max_length_k": max_length,
            **extra,
        }

    def _padded(self, parsed: list[_Row]) -> dict[str, Any]:
        width = self._round(max(len(r.input_ids) for r in parsed))
        batch = len(parsed)
        ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
        positions = torch.arange(width, dtype=torch.long).repeat(batch, 1)
        weights = torch.zeros((batch, width), dtype=torch.float32) if parsed[0].weights is not None else None
        for k, r in enumerate(parsed):
            n = len(r.input_ids)
            ids[k, :n] = r.input_ids
            labels[k, :n] = r.labels
            positions[k, :n] = r.position_ids
            positions[k, n:] -= n  # the padding counts from 0 again: a segment of its own
            if weights is not None and r.weights is not None:  # every row has them or none (see __call__)
                weights[k, :n] = r.weights
        out = {"input_ids": ids, "labels": labels, "position_ids": positions}
        if parsed[0].tree is not None:
            out["attention_mask"] = self._tree_mask(parsed, width)
        if weights is not None:
            out["loss_weights"] = weights
        return out

    def _tree_mask(self, parsed: list[_Row], width: int) -> torch.Tensor:
        """Return the additive [B, 1, width, width] mask of tree rows: 0 where the contract's attention
        rule allows, the dtype's minimum elsewhere (transformers' own convention for a float mask); or,
        for ``torch.bool``, True where it allows."""
        shape = (len(parsed), 1, width, width)
        if self.mask_dtype == torch.bool:  # the boolean form (True: may attend), for sdpa
            allowed = torch.zeros(shape, dtype=torch.bool)
            for k, r in enumerate(parsed):
                n = len(r.input_ids)
                if r.tree is not None:
                    allowed[k, 0, :n, :n] = r.tree
                allowed[k, 0, n:, n:] = torch.ones((width - n, width - n), dtype=torch.bool).tril_()
            return allowed
        mask = torch.full(shape, torch.finfo(self.mask_dtype).min, dtype=self.mask_dtype)
        for k, r in enumerate(parsed):
            n = len(r.input_ids)
            if r.tree is not None:  # every row has it here (see __call__)
                mask[k, 0, :n, :n].masked_fill_(r.tree, 0.0)
            mask[k, 0, n:, n:].triu_(1)  # the padding: a causal segment of its own
        return mask


def weighted_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    loss_weights: torch.Tensor,
    num_items_in_batch: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Return the weighted causal-LM loss: sum over trained tokens of w_t * CE_t, over the weight total.

    ``logits`` [B, T, V] (or [T, V]), ``labels`` and ``loss_weights`` [B, T] (or [T]) as the collator
    returns them: labels unshifted, so the logit at t is scored on the label (and weight) at t + 1.
    The denominator is ``num_items_in_batch`` when given, else the batch's weight total. Under
    gradient accumulation (and data parallelism), pass the weight total of every micro-batch of the
    optimizer step (on every rank): the sum of their ``loss_weights``, as the Trainer's
    ``num_items_in_batch`` counts trained tokens for the unweighted loss. With ``--loss-weighting
    sample`` that total is the number of samples trained in the step, and the loss is the mean of
    the samples' mean token losses.
    """
    logits = logits[..., :-1, :].float()
    target = labels[..., 1:].reshape(-1).to(logits.device)
    weights = loss_weights[..., 1:].reshape(-1).to(logits.device, torch.float32)
    token_loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target, ignore_index=IGNORE_INDEX, reduction="none"
    )
    total = (token_loss * weights).sum()
    denominator = weights.sum() if num_items_in_batch is None else num_items_in_batch
    return total / denominator


def _refuse_roles(rows: Sequence[Mapping[str, Any]]) -> None:
    """Refuse rows of a preference or KTO output: SFT on them would train the rejected answers too."""
    for k, row in enumerate(rows):
        roles = row.get("sample_role")
        if roles is not None and bool((torch.as_tensor(roles) > 0).any()):
            raise IncompatibleError(
                f"row {k} of the batch holds preference or KTO samples (sample_role above 0), which SFT "
                "would train every answer of; collate them with packcli.train.dpo.PreferenceCollator"
            )


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, dim=0)
    return cu


class _Row(NamedTuple):
    """One row's columns as 1-D int64 tensors."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    seq_lengths: torch.Tensor
    unpadded: torch.Tensor | None = None  # seq_lengths_unpadded
    weights: torch.Tensor | None = None  # loss_weights, float32
    tree: torch.Tensor | None = None  # tree rows: the attention rule, bool [n, n]


def _column(row: Mapping[str, Any], name: str, k: int) -> torch.Tensor:
    try:
        value = row[name]
    except KeyError:
        raise KeyError(
            f"row {k} of the batch has no '{name}' column; pass packed shard rows with input_ids, labels and "
            "position_ids (with the Trainer, set remove_unused_columns=False)"
        ) from None
    return torch.as_tensor(value, dtype=torch.long).reshape(-1)


def _parse_row(row: Mapping[str, Any], k: int) -> _Row:
    ids = _column(row, "input_ids", k)
    labels = _column(row, "labels", k)
    positions = _column(row, "position_ids", k)
    n = len(ids)
    if n == 0:
        raise ValueError(f"row {k} of the batch is empty")
    if len(labels) != n or len(positions) != n:
        raise ValueError(
            f"row {k} of the batch has {n} input_ids, {len(labels)} labels and {len(positions)} position_ids; "
            "the columns must have the same length"
        )
    if row.get("seq_lengths") is not None:
        lengths = _column(row, "seq_lengths", k)
        if int(lengths.sum()) != n or bool((lengths <= 0).any()):
            raise ValueError(f"row {k} of the batch: seq_lengths must be positive and sum to the row length {n}")
    else:
        starts = torch.nonzero(positions == 0).reshape(-1)
        if len(starts) == 0 or int(starts[0]) != 0:
            raise ValueError(f"row {k} of the batch: position_ids must start at 0")
        lengths = torch.diff(starts, append=torch.tensor([n]))
    unpadded = weights = None
    if row.get("seq_lengths_unpadded") is not None:
        unpadded = _column(row, "seq_lengths_unpadded", k)
        if len(unpadded) != len(lengths) or bool((unpadded > lengths).any()) or bool((unpadded < 0).any()):
            raise ValueError(f"row {k} of the batch: seq_lengths_unpadded must be 0..seq_lengths, one per sample")
    if row.get("loss_weights") is not None:
        weights = torch.as_tensor(row["loss_weights"], dtype=torch.float32).reshape(-1)
        if len(weights) != n:
            raise ValueError(f"row {k} of the batch has {len(weights)} loss_weights for {n} input_ids")
    return _Row(ids, labels, positions, lengths, unpadded, weights, _tree_rule(row, k, lengths, labels))


def _tree_rule(row: Mapping[str, Any], k: int, lengths: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
    """Return the attention rule of a tree row (None for a row without tree columns), after checking
    that its nodes tile every sample, that each parent is an earlier node of the same sample and that
    no node trains its first token."""
    if row.get(TREE_COLUMNS[0]) is None and row.get(TREE_COLUMNS[1]) is None:
        return None
    node_lengths = _column(row, TREE_COLUMNS[0], k)
    parents = _column(row, TREE_COLUMNS[1], k)
    ends = torch.cumsum(node_lengths, 0)
    sample_ends = torch.cumsum(lengths, 0)
    fits = len(parents) == len(node_lengths) > 0 and bool((node_lengths > 0).all())
    fits = fits and bool(torch.isin(sample_ends, ends).all()) and int(ends[-1]) == int(sample_ends[-1])
    if fits:
        sample_of = torch.searchsorted(sample_ends, ends - 1, right=True)  # each node's sample
        earlier = (parents >= -1) & (parents < torch.arange(len(parents)))
        same = sample_of[parents.clamp(min=0)] == sample_of
        fits = bool((earlier & ((parents == -1) | same)).all())
    if not fits:
        raise ValueError(
            f"row {k} of the batch: tree_node_lengths must tile every sample and tree_node_parents name an "
            "earlier node of the same sample (or -1), one per node"
        )
    if bool((labels[ends - node_lengths] != IGNORE_INDEX).any()):
        raise ValueError(
            f"row {k} of the batch trains the first token of a tree node, which the next-token shift would "
            "score from the end of another branch; pack the rows with packcli (verify names the row)"
        )
    return torch.from_numpy(tree_attention(node_lengths.numpy(), parents.numpy()))
