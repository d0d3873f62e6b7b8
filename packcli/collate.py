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

Neither layout returns an ``attention_mask``: transformers only looks for packed sequences in
``position_ids`` when the attention mask is None, so even an all-ones mask would make every sample
attend to the samples before it in the row. The model must also run with ``use_cache=False``: with a
cache present the packed-sequence detection is skipped too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import torch

from packcli.contract import IGNORE_INDEX

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

    Each row needs ``input_ids``, ``labels`` and ``position_ids``; ``seq_lengths`` is used for the
    sample boundaries when present, otherwise they are read from where ``position_ids`` is 0. Other
    columns (``sample_index``) are ignored. Values may be lists, numpy arrays or tensors.
    """

    def __init__(self, mode: Mode = "flatten", pad_token_id: int = 0, pad_to_multiple_of: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive integer, not {pad_to_multiple_of}")
        self.mode = mode
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of

    def __repr__(self) -> str:
        return (
            f"PackedCollator(mode={self.mode!r}, pad_token_id={self.pad_token_id}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of})"
        )

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Return the batch of ``rows``: tensors of dtype int64, plus the varlen kwargs in flatten mode."""
        if len(rows) == 0:
            raise ValueError("cannot collate an empty batch")
        parsed = [_parse_row(row, k) for k, row in enumerate(rows)]
        if self.mode == "flatten":
            return self._flatten(parsed)
        return self._padded(parsed)

    def _round(self, length: int) -> int:
        m = self.pad_to_multiple_of
        return length if m is None else -(-length // m) * m

    def _flatten(self, parsed: list[_Row]) -> dict[str, Any]:
        ids = torch.cat([r.input_ids for r in parsed])
        labels = torch.cat([r.labels for r in parsed])
        positions = torch.cat([r.position_ids for r in parsed])
        lengths = torch.cat([r.seq_lengths for r in parsed])
        pad = self._round(len(ids)) - len(ids)
        if pad:
            ids = torch.cat([ids, torch.full((pad,), self.pad_token_id, dtype=torch.long)])
            labels = torch.cat([labels, torch.full((pad,), IGNORE_INDEX, dtype=torch.long)])
            positions = torch.cat([positions, torch.arange(pad, dtype=torch.long)])
            lengths = torch.cat([lengths, torch.tensor([pad], dtype=torch.long)])
        cu_seq_lens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu_seq_lens[1:] = torch.cumsum(lengths, dim=0)
        max_length = int(lengths.max())
        return {
            "input_ids": ids.unsqueeze(0),
            "labels": labels.unsqueeze(0),
            "position_ids": positions.unsqueeze(0),
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens.clone(),
            "max_length_q": max_length,
            "max_length_k": max_length,
        }

    def _padded(self, parsed: list[_Row]) -> dict[str, Any]:
        width = self._round(max(len(r.input_ids) for r in parsed))
        batch = len(parsed)
        ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
        positions = torch.arange(width, dtype=torch.long).repeat(batch, 1)
        for k, r in enumerate(parsed):
            n = len(r.input_ids)
            ids[k, :n] = r.input_ids
            labels[k, :n] = r.labels
            positions[k, :n] = r.position_ids
            positions[k, n:] -= n  # the padding counts from 0 again: a segment of its own
        return {"input_ids": ids, "labels": labels, "position_ids": positions}


class _Row(NamedTuple):
    """One row's columns as 1-D int64 tensors."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    seq_lengths: torch.Tensor


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
    return _Row(ids, labels, positions, lengths)
