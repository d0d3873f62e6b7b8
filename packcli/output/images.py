"""The image columns of a row: each image of the row's samples, in row order, and where its tokens are.

Written when the run has a processor (``--processor``); the collator reads them by these names:

- ``image_refs`` list<string>: the image's absolute path, null when it came as bytes;
- ``image_bytes`` list<binary>: its bytes (only with ``--embed-images``, or when some image came as
  bytes; null where not embedded);
- ``image_sizes`` list<list<int32>>: [height, width] as the processor sees it (EXIF orientation applied);
- ``image_grid`` list<list<int32>>: the image's size parameters (Qwen2-VL: ``image_grid_thw``);
- ``image_tokens`` list<int32>: the image tokens it becomes;
- ``image_offsets`` list<int32>: the position in the row of its first token;
- ``image_sample`` list<int32>: the index of its sample in the row's ``seq_lengths``;
- ``image_spans`` list<int32>: the tokens of its whole expansion from its offset (only for the families
  whose image is more than a run of image tokens: Idefics3, SmolVLM; there the ``image_tokens`` image
  tokens lie among tile markers and newlines inside those tokens).

The manifest's image counts (``tokenizer.processor.images``) are those of the rows written
(``written_image_counts``, per shard as it is written), as its token counts are.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packcli.results import ImageRecord, ShardEntry, TokenizerIdentity

if TYPE_CHECKING:
    import pyarrow as pa

# pyarrow is imported by the functions that make columns: a text run imports this module for
# ``with_written_images`` alone, and a cache hit writes no column.

# The manifest's image counts: samples with images, images, their image tokens, images that came as bytes.
IMAGE_COUNTS = ("samples", "images", "image_tokens", "embedded")


def written(name: str, with_bytes: bool, with_spans: bool) -> bool:
    """Whether image column ``name`` is written: image_bytes only ``with_bytes``, image_spans only ``with_spans``."""
    return (with_bytes or name != "image_bytes") and (with_spans or name != "image_spans")


def image_fields(with_bytes: bool, with_spans: bool = False) -> list[pa.Field]:
    """Return the image columns' fields (``image_bytes`` only ``with_bytes``, ``image_spans`` only ``with_spans``)."""
    import pyarrow as pa

    from packcli.contract import IMAGE_COLUMNS

    return [pa.field(name, kind) for name, kind in IMAGE_COLUMNS if written(name, with_bytes, with_spans)]


def image_columns(
    images: list[list[ImageRecord]],
    lengths: np.ndarray,
    skips: np.ndarray,
    samples_per_row: np.ndarray,
    with_bytes: bool,
    embed: bool,
    with_spans: bool = False,
) -> list[pa.Array]:
    """Return the image columns of rows holding samples of ``lengths`` (in row order), ``samples_per_row`` each.

    ``images`` holds each sample's images (offsets within the sample as stored); ``skips`` the tokens
    cut from each sample's start (--truncate-side left), which move its images' offsets.
    """
    import pyarrow as pa

    from packcli.contract import IMAGE_COLUMNS

    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    row_first = np.cumsum(samples_per_row) - samples_per_row
    values: dict[str, list[list[Any]]] = {name: [] for name, _ in IMAGE_COLUMNS}
    for r, (first, count) in enumerate(zip(row_first.tolist(), np.asarray(samples_per_row).tolist(), strict=True)):
        row: dict[str, list[Any]] = {name: [] for name, _ in IMAGE_COLUMNS}
        row_start = int(starts[first]) if count else 0
        for j in range(first, first + count):
            for image in images[j]:
                path = image.get("path")
                row["image_refs"].append(path)
                data = image.get("bytes")
                if data is None and embed and path is not None:
                    data = Path(path).read_bytes()
                row["image_bytes"].append(data)
                row["image_sizes"].append([int(x) for x in image["size"]])
                row["image_grid"].append([int(x) for x in image["grid"]])
                row["image_tokens"].append(int(image["tokens"]))
                row["image_offsets"].append(int(starts[j]) - row_start + int(image["offset"]) - int(skips[j]))
                row["image_sample"].append(j - first)
                row["image_spans"].append(int(image["span"]))
        for name in values:
            values[name].append(row[name])
        del r
    return [pa.array(values[name], type=kind) for name, kind in IMAGE_COLUMNS if written(name, with_bytes, with_spans)]


def written_image_counts(table: pa.Table) -> dict[str, int]:
    """Return the image counts (``IMAGE_COUNTS``) of rows as written: a sample is counted once per row it
    is in, an image as bytes when it has no path (``image_refs`` null)."""
    import pyarrow.compute as pc

    refs = table.column("image_refs").combine_chunks()
    per_row = refs.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    sample = table.column("image_sample").combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    row = np.repeat(np.arange(len(per_row), dtype=np.int64), per_row)
    flat = refs.flatten()
    return {
        "samples": len(np.unique(row * (int(sample.max(initial=-1)) + 1) + sample)),
        "images": len(flat),
        "image_tokens": int(pc.sum(table.column("image_tokens").combine_chunks().flatten()).as_py() or 0),
        "embedded": flat.null_count,
    }


def with_written_images(tokenizer: TokenizerIdentity, shards: Sequence[ShardEntry]) -> TokenizerIdentity:
    """Return the run's tokenizer identity with its processor's image counts those of the shards written
    (each shard entry's ``images``, summed), not those of the token store; a text run's as it is."""
    processor = tokenizer.get("processor")
    if not isinstance(processor, dict):
        return tokenizer
    counts = {key: sum(int((s.images or {}).get(key, 0)) for s in shards) for key in IMAGE_COUNTS}
    return {**tokenizer, "processor": {**processor, "images": counts}}
