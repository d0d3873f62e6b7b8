"""The output contract every trainer reads: the shard schema, the label that means "no loss", the manifest.

The one place these are defined; the writers, the read-side commands, the tokenizer and the collator
import them from here (see the README's "The output contract").
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

IGNORE_INDEX = -100  # the label of a token that takes no loss
MANIFEST = "manifest.json"
SHARD_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())),
        ("seq_lengths", pa.list_(pa.int32())),
        ("sample_index", pa.list_(pa.int64())),
        ("piece_index", pa.list_(pa.int32())),
    ]
)
# Columns written only when asked for, after SHARD_SCHEMA's, in this order:
# seq_lengths_unpadded with --pad-to-multiple-of (or --context-parallel) above 1, loss_weights with
# --loss-weighting sample or sqrt, sample_role for preference and KTO data. A shard without them is
# byte-identical to one written before them.
OPTIONAL_COLUMNS = pa.schema(
    [
        ("seq_lengths_unpadded", pa.list_(pa.int32())),
        ("loss_weights", pa.list_(pa.float32())),
        ("sample_role", pa.list_(pa.int8())),
    ]
)
# sample_role values: what each sample of a preference or KTO output is (written with --task preference
# or kto, and 0 on a --pad-to-max padding segment).
SAMPLE_ROLES = {0: "sft", 1: "chosen", 2: "rejected", 3: "desirable", 4: "undesirable"}


def shard_schema(optional: tuple[str, ...] | list[str] = ()) -> pa.Schema:
    """Return SHARD_SCHEMA followed by the optional columns named in ``optional`` (in their fixed order)."""
    extra = [f for f in OPTIONAL_COLUMNS if f.name in optional]
    return pa.schema([*SHARD_SCHEMA, *extra])


# Progress callback: (stage, units done since the last call, total units or None).
Progress = Callable[[str, int, int | None], None]


def no_progress(stage: str, advance: int, total: int | None) -> None:
    """The progress callback that shows nothing."""
    return None
