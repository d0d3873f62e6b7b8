"""Three-dimensional rotary positions (mRoPE) of Qwen2-VL-family packed rows, computed per sample.

Qwen2-VL and Qwen2.5-VL rotate each token by three positions: temporal, height and width. A text token
has the same value in all three, one more than the token before it; an image's tokens (the run of
``<|image_pad|>`` its placeholder became) are laid out on the image's merged patch grid, all starting
from the position where the image begins, and the text after the image continues from that start plus
the grid's larger side. A packed row holds several samples back to back, so the positions restart at 0
at each sample, as each sample's own ``get_rope_index`` would give them.

Nothing extra is stored for this: the positions follow from the row's ``input_ids`` (where the image
tokens are), its ``seq_lengths`` (where the samples start) and its ``image_grid`` column (each image's
``[t, h, w]`` in patches), with the model's image token id and spatial merge size. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def mrope_positions(
    input_ids: Sequence[int] | npt.NDArray[np.integer],
    seq_lengths: Sequence[int] | npt.NDArray[np.integer],
    image_grids: Sequence[Sequence[int]] | npt.NDArray[np.integer],
    *,
    image_token_id: int,
    spatial_merge_size: int,
) -> npt.NDArray[np.int64]:
    """Return the (3, L) temporal/height/width positions of a packed row, restarting at 0 at each sample.

    What the row must hold: ``input_ids`` with each image as one run of ``image_token_id`` of exactly
    ``t * h * w // spatial_merge_size**2`` tokens, images in row order; ``seq_lengths`` summing to the
    row's length; ``image_grids`` one ``[t, h, w]`` per image (in patches, as the image processor's
    ``image_grid_thw``), in the same order. Images may sit anywhere in a sample, text before, between
    and after them; two images with no token between them are told apart by their counts (the
    templates of the family always write ``<|vision_start|>`` before an image and ``<|vision_end|>``
    after it, which are ordinary text here). No image crosses a sample boundary.

    Equal, on each sample alone, to ``Qwen2VLModel.get_rope_index`` (and Qwen2.5-VL's and Qwen3-VL's,
    for images) of transformers 5.24: a text run counts on from the current position; an image of grid (t, h, w)
    starting at position p gets (p + i, p + y, p + x) for its merged patch (i, y, x), row-major; the
    next token continues at p + max(h, w) // spatial_merge_size.

    Raises ValueError naming the sample and the image when the image tokens and the grids disagree.
    """
    ids = np.asarray(input_ids, dtype=np.int64).reshape(-1)
    lengths = np.asarray(seq_lengths, dtype=np.int64).reshape(-1)
    grids = np.asarray(image_grids, dtype=np.int64).reshape(-1, 3)
    n = len(ids)
    if int(lengths.sum()) != n or bool((lengths <= 0).any()):
        raise ValueError(f"seq_lengths must be positive and sum to the row length {n}")
    merge = int(spatial_merge_size)
    merged = grids // np.array([1, merge, merge])
    counts = merged.prod(axis=1)
    if bool((grids[:, 1:] % merge != 0).any()) or bool((counts <= 0).any()):
        bad = int(np.flatnonzero((grids[:, 1:] % merge != 0).any(axis=1) | (counts <= 0))[0])
        raise ValueError(f"image {bad}'s grid {grids[bad].tolist()} is not a whole number of {merge}x{merge} merges")

    positions = np.empty((3, n), dtype=np.int64)
    is_image = ids == image_token_id
    image = 0
    start = 0
    for sample, length in enumerate(lengths.tolist()):
        end = start + length
        flags = is_image[start:end]
        # Runs of equal flags inside the sample: [run_starts[k], run_starts[k + 1]).
        run_starts = np.concatenate(([0], np.flatnonzero(flags[1:] != flags[:-1]) + 1, [length]))
        current = 0
        for a, b in zip(run_starts[:-1].tolist(), run_starts[1:].tolist(), strict=True):
            if not flags[a]:
                positions[:, start + a : start + b] = np.arange(current, current + b - a)
                current += b - a
                continue
            at = a
            while at < b:  # one run may hold several images back to back
                if image >= len(grids):
                    raise ValueError(
                        f"sample {sample} of the row has more image tokens than the row's {len(grids)} images"
                    )
                count = int(counts[image])
                if at + count > b:
                    raise ValueError(
                        f"sample {sample} of the row: image {image} (grid {grids[image].tolist()}) needs "
                        f"{count} image tokens, its run has {b - at}"
                    )
                t, h, w = merged[image].tolist()
                grid = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
                positions[:, start + at : start + at + count] = current + np.stack([g.reshape(-1) for g in grid])
                current += max(h, w)
                at += count
                image += 1
        start = end
    if image != len(grids):
        raise ValueError(f"the row has {len(grids)} images but image tokens for {image}")
    return positions
