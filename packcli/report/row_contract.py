"""The row contract as ``verify`` checks it: each check's key and message (``CHECKS``), what the manifest
says a shard's rows must be (``Expected``), and what the checks of a shard's batches sum (``ShardTotals``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packcli.contract import SHARD_SCHEMA
from packcli.errors import Opt, Text
from packcli.report.images import ImageChecker
from packcli.report.trees import TREE_CHECKS

# Each row check: a key, and the message for the rows that fail it (text, or text and Opt parts).
CHECKS: dict[str, Text] = {
    "nulls": "hold null values",
    "token_columns": "have input_ids, labels and position_ids of different lengths",
    "segment_columns": "have seq_lengths, sample_index and piece_index of different lengths",
    "empty": "are empty",
    "too_long": "are longer than max_len {max_len}",
    "not_padded": ("are not padded to max_len {max_len} (the output was packed with ", Opt("pad_to_max"), ")"),
    "seq_lengths_positive": "have a seq_lengths value below 1",
    "seq_lengths_sum": "have seq_lengths that do not sum to the row length",
    "vocab": "have input_ids outside the tokenizer's vocabulary [0, {vocab_size})",
    "positions": "have position_ids that do not run 0..n-1 restarting at every sample",
    "first_label": "have a sample whose first label is not -100",
    "labels": "have labels that differ from input_ids where they are not -100",
    "sample_index": "have a sample_index below -1",
    "padding_unexpected": (
        "have a padding segment (sample_index -1) but the output was packed without ",
        Opt("pad_to_max"),
    ),
    "padding_labels": "have a padding segment with labels other than -100",
    "padding_not_last": "have a padding segment that is not the row's last segment",
    "sample_index_order": "have (sample_index, piece_index) pairs that do not ascend within the row",
    "piece_index": "have a piece_index below 0 (or other than 0 on a padding segment)",
    "unpadded": "have seq_lengths_unpadded values that are not the real length of their segment",
    "alignment": (
        "have samples not padded to the multiple the output was packed with (",
        Opt("pad_to_multiple_of"),
        ")",
    ),
    "alignment_labels": "have labels other than -100 in a sample's alignment padding",
    "sample_role": "have sample_role values that are not the task's (preference: 1 chosen, 2 rejected; kto: 3 "
    "desirable, 4 undesirable; 0 on a padding segment), or not one per sample",
    "pairs": "have a chosen sample not followed by its rejected sample (the same sample_index, piece 0 then 1), "
    "or a rejected sample without its chosen one before it",
    "source": "have source values that are not the manifest's mix source of their sample_index (-1 on a padding "
    "segment), or not one per sample",
    "loss_weights": "have loss_weights that are negative, not finite, of the wrong length or set where labels are -100",
    "loss_weights_values": (
        "have loss_weights that are not the {weighting} weighting the manifest records (",
        Opt("loss_weighting"),
        " {weighting}: {rule} on each of a sample's n trained tokens)",
    ),
    "image_rows": "have images that do not fit their tokens (the collator would refuse them)",
    "image_stray": "have image tokens but no images",
    "image_rule": "have images whose token count or grid is not what the processor gives for their size",
    "image_file": "have images whose file or bytes cannot be read now",
    "image_size": "have images whose file has another size now than when packed (image_sizes)",
    **TREE_CHECKS,
}
WEIGHTING_RULES = {"sample": "1/n", "sqrt": "1/sqrt(n)"}
# loss_weights are float32: a recomputed weight may differ from the stored one in its last bits only.
WEIGHT_RTOL = 1e-6


@dataclass
class Expected:
    """What the manifest says a shard's rows must be."""

    max_len: int
    pad_to_max: bool
    vocab_size: int | None
    columns: tuple[str, ...] = tuple(SHARD_SCHEMA.names)
    pad_multiple: int = 1
    pad_offset: int = 0
    task: str = "sft"
    loss_weighting: str | None = None  # the manifest's --loss-weighting (None: not recorded)
    # --mix: each input's first sample_index and its mix source (None: no --mix)
    mix_inputs: tuple[np.ndarray, np.ndarray] | None = None
    images: ImageChecker | None = None  # the output has image columns: check its rows' images
    trees: bool = False  # the manifest says the rows hold prefix trees (contract.PREFIX_TREES)


@dataclass
class ShardTotals:
    """One shard's counts and failing rows, summed over its batches."""

    rows: int = 0
    tokens: int = 0  # every token in the rows, padding segments included (what the manifest's shard entry counts)
    sample_tokens: int = 0  # real sample tokens: padding segments and alignment padding left out
    alignment: int = 0  # alignment padding tokens
    trainable: int = 0
    max_id: int | None = None  # the largest input id, padding included (the manifest's max_token_id)
    failures: dict[str, list[int]] = field(default_factory=dict)  # check -> [count, first row]
    first_problem: dict[str, str] = field(default_factory=dict)  # check -> what is wrong in its first row
    images: int = 0
    image_tokens: int = 0
    image_samples: int = 0  # samples with at least one image
    embedded_images: int = 0  # images that came as bytes (no path)
    index: list[np.ndarray] = field(default_factory=list)
    pieces: list[np.ndarray] = field(default_factory=list)

    def fail(self, check: str, bad_rows: np.ndarray, first_row: int) -> None:
        rows = np.unique(bad_rows)
        if len(rows) == 0:
            return
        seen = self.failures.setdefault(check, [0, int(rows[0]) + first_row])
        seen[0] += len(rows)
