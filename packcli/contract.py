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

# Progress callback: (stage, units done since the last call, total units or None).
Progress = Callable[[str, int, int | None], None]


def no_progress(stage: str, advance: int, total: int | None) -> None:
    """The progress callback that shows nothing."""
    return None
