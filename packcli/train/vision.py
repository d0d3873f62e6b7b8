"""Turn packed image-text rows into a vision-language model's inputs (needs the ``torch`` extra).

A row packed with ``--processor`` holds, beside ``input_ids``, ``labels``, ``position_ids`` and
``seq_lengths``, its images in row order: ``image_refs`` (each image's absolute path, null when it came
as bytes), ``image_bytes`` (the bytes, when embedded or when they came as bytes), ``image_sizes``
([height, width] as the processor sees the image), ``image_grid`` (the family's size parameters;
Qwen2-VL: ``image_grid_thw``), ``image_tokens`` (how many image tokens the image's placeholder became),
``image_offsets`` (where in the row its first token is) and ``image_sample`` (which sample of the row,
an index into ``seq_lengths``, it belongs to). Labels are -100 on every image token.

:class:`VisionCollator` loads a batch's images, runs the processor's image processor once over them and
returns the model's inputs. Before it returns, it checks that every image's feature count from the image
processor equals the image tokens the row holds for it (the mismatch that otherwise stops a run inside
the model, hours in) and raises one line naming the row, the sample and the image when it does not.

Qwen2-VL / Qwen2.5-VL (mRoPE): ``position_ids`` has shape (4, B, T). Row 0 is the text positions, the
rows' ``position_ids`` restarting at 0 at each sample: the model builds the packed attention mask from
it (sdpa, eager, flex) and flash attention reads the sample boundaries from it (one row, flatten mode).
Rows 1-3 are the temporal, height and width positions of each sample alone
(:func:`packcli.train.mrope.mrope_positions`). Given (3, B, T) instead, the model finds no packed
samples and every sample attends to the ones before it in the row.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packcli.contract import IGNORE_INDEX, IMAGE_COLUMNS as IMAGE_FIELDS
from packcli.errors import IncompatibleError, InputError, RecordError
from packcli.train.mrope import mrope_positions
from packcli.vision import ImageRef, VisionProcessor, load_processor

if TYPE_CHECKING:
    from packcli.train.collate import Mode

IMAGE_COLUMNS: tuple[str, ...] = tuple(name for name, _ in IMAGE_FIELDS)
# The families whose positions are three-dimensional (mRoPE) and whose image processor gives a grid:
# Qwen2-VL and Qwen2.5-VL, and Qwen3-VL, whose get_rope_index places images by the same rule.
MROPE_FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen3_vl")


@dataclass(frozen=True)
class RowImage:
    """One image of a packed row, as its columns describe it."""

    row: int  # the row's place in the batch
    index: int  # the image's place in its row
    sample: int  # which sample of the row (an index into seq_lengths)
    sample_index: int | None  # that sample's sample_index (its place in the input), when the row has one
    ref: ImageRef
    size: tuple[int, int]  # (height, width) as packed
    grid: tuple[int, ...]
    tokens: int
    offset: int
    # The tokens of its whole expansion from ``offset`` (``image_spans``; Idefics3, SmolVLM: tile markers,
    # newlines and the image tokens); ``tokens`` where the expansion is a pure run of image tokens.
    span: int = 0

    @property
    def name(self) -> str:
        """How messages name the image: its row, its sample and the image itself."""
        sample = f"sample {self.sample}" + (
            f" (sample_index {self.sample_index})" if self.sample_index is not None else ""
        )
        return f"row {self.row} of the batch, {sample}, image {self.index} ({self.ref.label})"


def row_images(row: Mapping[str, Any], k: int, image_token_id: int) -> list[RowImage]:
    """Return the images of the ``k``-th row of a batch, checked against its tokens.

    Each image's ``image_tokens`` tokens at ``image_offsets`` must be image tokens inside the sample
    ``image_sample`` names, untrained (label -100), and the row must hold no other image token. With
    ``image_spans`` (a family whose image is more than its image tokens), the image's tokens are its
    span's from its offset: inside its sample, untrained, holding exactly ``image_tokens`` image tokens.
    Raises IncompatibleError naming the row, the sample and the image otherwise.
    """
    refs = _listed(row, "image_refs")
    n = len(refs)
    spanned = row.get("image_spans") is not None
    columns = {name: _listed(row, name, n) for name in IMAGE_COLUMNS[1:] if spanned or name != "image_spans"}
    ids = np.asarray(row["input_ids"], dtype=np.int64).reshape(-1)
    labels = np.asarray(row["labels"], dtype=np.int64).reshape(-1)
    lengths = _sample_lengths(row)
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    indices = row.get("sample_index")
    images: list[RowImage] = []
    for j in range(n):
        data = columns["image_bytes"][j] if columns["image_bytes"] else None
        ref = ImageRef(path=refs[j], data=data) if data is not None else ImageRef(path=refs[j])
        sample = _int(columns["image_sample"][j])
        tokens = _int(columns["image_tokens"][j])
        image = RowImage(
            row=k,
            index=j,
            sample=sample,
            sample_index=int(indices[sample]) if indices is not None and 0 <= sample < len(indices) else None,
            ref=ref,
            size=_pair(columns["image_sizes"][j]),
            grid=tuple(int(x) for x in columns["image_grid"][j] or ()),
            tokens=tokens,
            offset=_int(columns["image_offsets"][j]),
            span=_int(columns["image_spans"][j]) if spanned else tokens,
        )
        if ref.path is None and ref.data is None:
            raise IncompatibleError(f"{image.name}: the row holds neither its path nor its bytes")
        if not 0 <= sample < len(lengths):
            raise IncompatibleError(f"{image.name}: image_sample {sample} is not a sample of the row")
        start, end = image.offset, image.offset + image.span
        what = f"{image.span} tokens" if spanned else f"{image.tokens} image tokens"
        if image.tokens <= 0 or image.span < image.tokens or start < bounds[sample] or end > bounds[sample + 1]:
            raise IncompatibleError(
                f"{image.name}: its {what} at {start} are not inside its sample "
                f"(tokens {bounds[sample]} to {bounds[sample + 1]}); the row is corrupt, pack it again"
            )
        if not spanned and not bool((ids[start:end] == image_token_id).all()):
            raise IncompatibleError(
                f"{image.name}: tokens {start} to {end} of the row are not all the image token "
                f"{image_token_id}; the row was packed with another tokenizer or processor"
            )
        held = int((ids[start:end] == image_token_id).sum())
        if held != image.tokens:
            raise IncompatibleError(
                f"{image.name}: tokens {start} to {end} of the row hold {held} image tokens "
                f"{image_token_id}, not {image.tokens}; the row was packed with another tokenizer or processor"
            )
        if bool((labels[start:end] != IGNORE_INDEX).any()):
            raise IncompatibleError(f"{image.name}: its image tokens are trained (labels not -100); pack it again")
        images.append(image)
    counted = int((ids == image_token_id).sum())
    if counted != sum(im.tokens for im in images) or any(
        a.offset + a.span > b.offset for a, b in itertools.pairwise(images)
    ):
        raise IncompatibleError(
            f"row {k} of the batch holds {counted} image tokens, its {n} images account for "
            f"{sum(im.tokens for im in images)} (in row order, not overlapping); the row was packed with "
            "another tokenizer or processor"
        )
    return images


def load_image(ref: ImageRef) -> Any:
    """Return the image as the processors' loader gives it: EXIF orientation applied, RGB (a PIL image).

    Raises InputError naming the image when it is missing or cannot be read.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        source = io.BytesIO(ref.data) if ref.data is not None else Path(str(ref.path))
        with Image.open(source) as im:
            return ImageOps.exif_transpose(im).convert("RGB")
    except FileNotFoundError:
        raise InputError(f"image {ref.label} does not exist; it was there when the data was packed") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(f"image {ref.label} cannot be read as an image ({type(exc).__name__})") from None


class VisionCollator:
    """Collate packed image-text rows into one batch of a vision-language model's inputs.

    Args:
        processor: the processor the rows were packed with (its directory, or a loaded
            :class:`packcli.vision.VisionProcessor`); its image processor (PIL backend) makes the pixels.
        mode: ``"flatten"`` (the batch's rows as one [1, T] sequence) or ``"padded"`` ([B, T]), as
            :class:`packcli.train.collate.PackedCollator` lays out the tokens.
        pad_token_id, pad_to_multiple_of: as for ``PackedCollator``.
        image_token_id: the id of the image token; by default the model's ``config.image_token_id``,
            else the processor's tokenizer's.
        model: the model trained: its input embedding size, image token id and spatial merge size are
            checked against the processor (IncompatibleError when they do not fit).
        boundaries: also return the text collator's flash-attention varlen kwargs (``cu_seq_lens_q``,
            ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``, flatten mode). Off by default:
            Qwen2-VL's vision tower passes the model's keyword arguments on to its own flash-attention
            call, which sets ``cu_seq_lens_q`` itself, so ``model(**batch)`` would fail with them. The
            text positions (row 0 of ``position_ids``) carry the same boundaries to sdpa, eager and flex,
            and to flash attention in flatten mode. Take them out of the batch before calling the model.

    The batch: ``input_ids``, ``labels`` (int64, [1, T] or [B, T]), ``position_ids`` ((4, B, T) for
    Qwen2-VL-family processors, see the module's docstring; [B, T] otherwise), and when the batch has
    images, the image processor's outputs over the batch's images in row order (Qwen2-VL:
    ``pixel_values`` [patches, C*t*p*p] float32 and ``image_grid_thw`` [images, 3] int64; Idefics3 / SmolVLM:
    ``pixel_values`` [images, tiles, C, H, W] and ``pixel_attention_mask``). No
    attention mask, and the model must run with ``use_cache=False`` (see ``PackedCollator``).
    """

    def __init__(
        self,
        processor: str | Path | VisionProcessor,
        mode: Mode = "flatten",
        pad_token_id: int = 0,
        pad_to_multiple_of: int | None = None,
        *,
        image_token_id: int | None = None,
        model: Any = None,
        boundaries: bool = False,
    ) -> None:
        from packcli.train.collate import PackedCollator

        self.processor = processor if isinstance(processor, VisionProcessor) else load_processor(str(processor))
        self.text = PackedCollator(mode, pad_token_id, pad_to_multiple_of, model=model)
        self.mode = mode
        self.boundaries = boundaries
        self.mrope = self.processor.family in MROPE_FAMILIES
        self.merge_size = int(getattr(self.processor.image_processor, "merge_size", 1) or 1)
        config: Any = getattr(model, "config", None)
        model_token = getattr(config, "image_token_id", None)
        if image_token_id is None and model_token is not None:
            image_token_id = int(model_token)
        elif image_token_id is not None and model_token is not None and int(model_token) != image_token_id:
            raise IncompatibleError(
                f"the model's image token id is {model_token}, not {image_token_id}; pass the model's processor"
            )
        if image_token_id is None:
            from packcli.tokenize.encoders.tokenizer import load_tokenizer

            image_token_id = self.processor.token_id(load_tokenizer(self.processor.name))
        self.image_token_id = int(image_token_id)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else None
        rope = getattr(text_config, "rope_parameters", None)
        if isinstance(rope, dict) and "mrope_section" in rope and not self.mrope:
            raise IncompatibleError(
                f"the model takes mRoPE positions, which packcli computes for {', '.join(MROPE_FAMILIES)} "
                f"processors, not {self.processor.family}; pass the model's processor"
            )
        vision = getattr(config, "vision_config", None)
        model_merge = getattr(vision, "spatial_merge_size", None)
        if self.mrope and model_merge is not None and int(model_merge) != self.merge_size:
            raise IncompatibleError(
                f"the model merges {model_merge}x{model_merge} patches, the image processor "
                f"{self.merge_size}x{self.merge_size}; pass the model's processor"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.processor.name!r}, mode={self.mode!r}, family={self.processor.family!r})"

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Return the batch of ``rows`` as torch tensors, every image's features checked against its tokens."""
        import torch

        batch = self.text(rows)  # refuses an empty batch, bad columns, ids outside the embedding
        if not self.boundaries:
            for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
                batch.pop(key, None)
        images = [im for k, row in enumerate(rows) for im in row_images(row, k, self.image_token_id)]
        grids: list[tuple[int, ...]] = []
        if images:
            pixels = [load_image(im.ref) for im in images]
            if self.processor.pure:
                features = self.processor.image_processor(images=pixels, return_tensors="pt")
                grids = self._check(images, pixels, features)
            else:
                features = self._tiles(images, pixels)
            batch.update(features)
        if self.mrope:
            batch["position_ids"] = self._mrope(rows, batch["position_ids"], images, grids, torch)
        return batch

    def _check(self, images: list[RowImage], pixels: list[Any], features: Mapping[str, Any]) -> list[tuple[int, ...]]:
        """Check each image's feature count against its tokens; return the image processor's grids."""
        grids: list[tuple[int, ...]] = []
        for k, (image, pixel) in enumerate(zip(images, pixels, strict=True)):
            size = (pixel.height, pixel.width)
            resized = (
                ""
                if size == image.size
                else f" (it is {size[1]}x{size[0]} now, {image.size[1]}x{image.size[0]} when packed)"
            )
            if self.mrope:
                grid = tuple(int(x) for x in features["image_grid_thw"][k])
                count = int(np.prod(grid)) // self.merge_size**2
                if count != image.tokens or grid != image.grid:
                    raise IncompatibleError(
                        f"{image.name}: the image processor gives {count} image features (grid {list(grid)}), "
                        f"the row holds {image.tokens} image tokens (grid {list(image.grid)}){resized}; "
                        "pack the data again with this processor"
                    )
                grids.append(grid)
            else:
                try:
                    count = self.processor.measure(*size).count
                except RecordError as exc:
                    raise IncompatibleError(f"{image.name}: {exc.detail}") from None
                if count != image.tokens:
                    raise IncompatibleError(
                        f"{image.name}: the {self.processor.family} processor gives {count} image features, "
                        f"the row holds {image.tokens} image tokens{resized}; pack the data again with this processor"
                    )
        return grids

    def _tiles(self, images: list[RowImage], pixels: list[Any]) -> Any:
        """Idefics3 / SmolVLM: the image processor's tiles (``pixel_values``, ``pixel_attention_mask``), each
        image's tiles (rows x cols + the whole image, or the whole image alone) times the processor's
        ``image_seq_len`` checked against its ``image_tokens`` and its (rows, cols) against ``image_grid``."""
        features = self.processor.image_processor(
            images=[[p] for p in pixels], return_tensors="pt", return_row_col_info=True
        )
        rows, cols = features.pop("rows", None), features.pop("cols", None)
        seq_len = int(self.processor.processor.image_seq_len)
        for k, image in enumerate(images):
            r, c = (int(rows[k][0]), int(cols[k][0])) if rows is not None and cols is not None else image.grid
            count = (r * c + 1 if r * c else 1) * seq_len
            if count != image.tokens or (r, c) != image.grid:
                raise IncompatibleError(
                    f"{image.name}: the {self.processor.family} image processor gives {r}x{c} tiles, "
                    f"{count} image features, the row holds {image.tokens} image tokens (grid "
                    f"{list(image.grid)}); pack the data again with this processor"
                )
        return features

    def _mrope(
        self,
        rows: Sequence[Mapping[str, Any]],
        text: Any,
        images: list[RowImage],
        grids: list[tuple[int, ...]],
        torch: Any,
    ) -> Any:
        """Return the (4, B, T) positions: the text positions, then each sample's mRoPE positions."""
        spatial = text.unsqueeze(0).repeat(3, 1, 1)  # padding keeps its text positions in all three
        flat = self.mode == "flatten"
        start = 0
        for k, row in enumerate(rows):
            ids = np.asarray(row["input_ids"], dtype=np.int64).reshape(-1)
            lengths = _sample_lengths(row)
            own = [g for im, g in zip(images, grids, strict=True) if im.row == k]
            computed = mrope_positions(
                ids, lengths, own, image_token_id=self.image_token_id, spatial_merge_size=self.merge_size
            )
            where = (0, slice(start, start + len(ids))) if flat else (k, slice(0, len(ids)))
            spatial[:, where[0], where[1]] = torch.from_numpy(computed)
            start += len(ids)
        return torch.cat([text.unsqueeze(0), spatial], dim=0)


def _listed(row: Mapping[str, Any], name: str, n: int | None = None) -> list[Any]:
    """Return a row's image column as a list (empty when the row has none), of length ``n`` when given."""
    value = row.get(name)
    values = [] if value is None else list(value)
    if n is not None and values and len(values) != n:
        raise IncompatibleError(f"the row has {n} image_refs but {len(values)} {name}; the row is corrupt")
    if n is not None and not values and n and name != "image_bytes":
        raise IncompatibleError(f"the row has {n} images but no {name} column; pass rows with every image column")
    return values


def _sample_lengths(row: Mapping[str, Any]) -> np.ndarray:
    """Return the row's sample lengths: ``seq_lengths``, else where ``position_ids`` restarts at 0."""
    if row.get("seq_lengths") is not None:
        return np.asarray(row["seq_lengths"], dtype=np.int64).reshape(-1)
    positions = np.asarray(row["position_ids"], dtype=np.int64).reshape(-1)
    return np.diff(np.append(np.flatnonzero(positions == 0), len(positions)))


def _int(value: Any) -> int:
    return int(value)


def _pair(value: Any) -> tuple[int, int]:
    height, width = (int(x) for x in value)
    return height, width
