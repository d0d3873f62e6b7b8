"""The images of packed rows, read back: how inspect shows them, what stats counts, what verify checks.

A row of an image-text output holds, per image in row order (``docs/images.md``): ``image_refs``,
``image_bytes`` (when embedded), ``image_sizes`` [height, width], ``image_grid`` (the family's size
parameters; Qwen2-VL: image_grid_thw), ``image_tokens`` (tokens of the image's expansion),
``image_offsets`` (its first token in the row) and ``image_sample`` (its sample, an index into
``seq_lengths``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from packcli.contract import IGNORE_INDEX

IMAGE_COLUMNS = ("image_refs", "image_sizes", "image_grid", "image_tokens", "image_offsets", "image_sample")


@dataclass(frozen=True)
class RowImage:
    """One image of a packed row, as its columns give it."""

    position: int  # its place among the row's images, from 0
    ref: str | None
    data: bytes | None
    size: tuple[int, int]  # height, width
    grid: tuple[int, ...]
    tokens: int
    offset: int
    sample: int

    @property
    def label(self) -> str:
        """How ``inspect`` shows the image in place of its tokens: ``<image 3: 28x40 patches, 280 tokens>``."""
        return f"<image {self.position + 1}: {grid_words(self.grid, self.size)}, {self.tokens} tokens>"


def grid_words(grid: tuple[int, ...], size: tuple[int, int]) -> str:
    """Return an image's size parameters in words: patches (t, h, w grids), tiles (rows, cols), or pixels."""
    if len(grid) == 3:
        t, h, w = grid
        return f"{h}x{w} patches" if t == 1 else f"{t}x{h}x{w} patches"
    if len(grid) == 2:
        return f"{grid[0]}x{grid[1]} tiles"
    return f"{size[1]}x{size[0]} px"


def has_images(columns: list[str] | tuple[str, ...] | None) -> bool:
    """Return whether an output's columns are those of image-text rows."""
    return bool(columns) and all(c in columns for c in IMAGE_COLUMNS)  # type: ignore[operator]


def row_images(row: dict[str, Any]) -> list[RowImage]:
    """Return a row's images (a row read as a dict of lists, e.g. ``to_pylist()``); none without image columns."""
    refs = row.get("image_refs")
    if refs is None:
        return []
    data = row.get("image_bytes") or [None] * len(refs)
    return [
        RowImage(
            position=k,
            ref=refs[k],
            data=data[k] if k < len(data) else None,
            size=(int(row["image_sizes"][k][0]), int(row["image_sizes"][k][1])),
            grid=tuple(int(x) for x in row["image_grid"][k]),
            tokens=int(row["image_tokens"][k]),
            offset=int(row["image_offsets"][k]),
            sample=int(row["image_sample"][k]),
        )
        for k in range(len(refs))
    ]


def row_image_problems(
    row: dict[str, Any],
    image_token_id: int | None,
    expansion: Callable[[int, int], tuple[int, tuple[int, ...], int]] | None = None,
) -> Iterator[str]:
    """Yield what is wrong with one row's images (nothing when all is right).

    Checks that every image column has one entry per image, that each image's tokens lie inside its own
    sample, hold exactly the image tokens its expansion has, are never trained, and that no image token
    stands outside an image. With ``expansion`` (height, width -> count, grid, image tokens in the
    expansion; the processor's own rule), each image's count and grid must be what its size gives.
    """
    refs = row.get("image_refs") or []
    n = len(refs)
    for name in IMAGE_COLUMNS[1:]:
        if len(row.get(name) or []) != n:
            yield f"{name} has {len(row.get(name) or [])} entries for {n} images"
            return
    if row.get("image_bytes") is not None and len(row["image_bytes"]) != n:
        yield f"image_bytes has {len(row['image_bytes'])} entries for {n} images"
        return
    ids = np.asarray(row["input_ids"], dtype=np.int64)
    labels = np.asarray(row["labels"], dtype=np.int64)
    lengths = np.asarray(row["seq_lengths"], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    covered = np.zeros(len(ids), dtype=bool)
    for image in row_images(row):
        where = f"image {image.position + 1} ({image.ref or 'embedded'})"
        if image.ref is None and image.data is None:
            yield f"{where} has neither a path nor bytes"
        if not 0 <= image.sample < len(lengths):
            yield f"{where} names sample {image.sample} of a row of {len(lengths)}"
            continue
        begin, end = image.offset, image.offset + image.tokens
        if image.tokens < 1 or begin < starts[image.sample] or end > starts[image.sample + 1]:
            yield f"{where}: its tokens {begin}..{end} are not inside its sample"
            continue
        span = ids[begin:end]
        if np.any(labels[begin:end] != IGNORE_INDEX):
            yield f"{where} has trained tokens"
        covered[begin:end] = True
        held = int(np.count_nonzero(span == image_token_id)) if image_token_id is not None else None
        if expansion is not None:
            count, grid, image_ids = expansion(*image.size)
            if (count, grid) != (image.tokens, image.grid):
                yield (
                    f"{where}: a {image.size[1]}x{image.size[0]} image becomes {count} tokens, grid {list(grid)}, "
                    f"the row says {image.tokens}, grid {list(image.grid)}"
                )
            elif held is not None and held != image_ids:
                yield f"{where} holds {held} image tokens, its expansion has {image_ids}"
    if image_token_id is not None:
        stray = int(np.count_nonzero((ids == image_token_id) & ~covered))
        if stray:
            yield f"{stray} image tokens stand outside every image"
