"""The images of packed rows, read back: how inspect shows them, what stats counts, what verify checks.

A row of an image-text output holds, per image in row order (``docs/images.md``): ``image_refs``,
``image_bytes`` (when embedded), ``image_sizes`` [height, width], ``image_grid`` (the family's size
parameters; Qwen2-VL: image_grid_thw), ``image_tokens`` (tokens of the image's expansion),
``image_offsets`` (its first token in the row), ``image_sample`` (its sample, an index into
``seq_lengths``) and, for Idefics3 / SmolVLM, ``image_spans`` (the tokens of its whole expansion). A
row's images are read and checked against its tokens by the collator's own
:func:`packcli.train.vision.row_images`; this module adds what only an offline check can do: the
processor's rule for each image's size (and, with spans, the expansion's ids), and the image file as it
is now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packcli.contract import IMAGE_COLUMNS as IMAGE_FIELDS
from packcli.errors import IncompatibleError, RecordError, TokenizerError, first_line
from packcli.jsontypes import JSONObject
from packcli.train.vision import RowImage, row_images
from packcli.vision import ImageRef, VisionProcessor, image_size, load_processor

__all__ = ["IMAGE_COLUMNS", "ImageChecker", "RowImage", "grid_words", "image_label", "row_images"]

# The columns every image-text row has (``image_bytes`` only when some image is embedded, ``image_spans``
# only for a family whose image is more than its image tokens).
IMAGE_COLUMNS = tuple(name for name, _ in IMAGE_FIELDS if name not in ("image_bytes", "image_spans"))


# The families whose grid is the image's own size (LLaVA-NeXT: image_sizes), not tiles.
SIZE_GRIDS = ("llava_next",)


def grid_words(grid: tuple[int, ...], size: tuple[int, int], family: str | None = None) -> str:
    """Return an image's size parameters in words: patches (t, h, w grids), tiles (rows, cols), or pixels.

    ``size`` is (height, width); pixels are written width x height. A two-number grid is tiles unless
    the family's grid is the image's size (LLaVA-NeXT), or, family unknown, it equals the size.
    """
    if len(grid) == 3:
        t, h, w = grid
        return f"{h}x{w} patches" if t == 1 else f"{t}x{h}x{w} patches"
    if len(grid) == 2 and family not in SIZE_GRIDS and tuple(grid) != tuple(size):
        return f"{grid[0]}x{grid[1]} tiles"
    return f"{size[1]}x{size[0]} pixels"


def image_label(image: RowImage, family: str | None = None) -> str:
    """How ``inspect`` shows an image in place of its tokens: ``<image 3: 28x40 patches, 280 tokens>``.

    The number is the image's place in its row, from 1.
    """
    return f"<image {image.index + 1}: {grid_words(image.grid, image.size, family)}, {image.tokens} tokens>"


@dataclass
class ImageChecker:
    """Check the images of packed rows: against their tokens, the processor's rule and their files.

    ``processor`` is the manifest's processor directory; when it cannot be loaded, ``processor_problem``
    says why and the rule is not checked (the other checks still run). Sizes and expansions are
    remembered per file and per size, so an image used by many samples is read once.
    """

    image_token_id: int
    processor_dir: str | None = None
    check_files: bool = True
    processor: VisionProcessor | None = field(default=None, init=False)
    processor_problem: str | None = field(default=None, init=False)
    _rule: dict[tuple[int, int], tuple[int, tuple[int, ...]] | str] = field(default_factory=dict, init=False)
    _sizes: dict[str, tuple[int, int] | None] = field(default_factory=dict, init=False)
    # A family whose image is more than its image tokens (image_spans): each size's expansion in token ids.
    _tokenizer: Any = field(default=None, init=False)
    _ids: dict[tuple[int, int], list[int]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.processor_dir is None:
            return
        try:
            self.processor = load_processor(self.processor_dir)
        except TokenizerError as exc:
            self.processor_problem = (
                f"{first_line(exc)}; the images' token counts and grids were not checked against its rule"
            )

    def problems(self, row: Mapping[str, Any], k: int) -> list[tuple[str, str]]:
        """Return what is wrong with a row's images (row ``k`` of its shard), as (check, message) pairs.

        Checks: ``image_rows`` (the collator's checks: columns, tokens inside the sample, all image
        tokens, untrained, no image token outside an image), ``image_rule`` (count and grid the
        processor gives for the image's size), ``image_file`` (the file or bytes cannot be read now),
        ``image_size`` (the file's size now differs from ``image_sizes``).
        """
        try:
            images = row_images(row, k, self.image_token_id)
        except IncompatibleError as exc:
            message = str(exc).replace(f"row {k} of the batch, ", "").replace(f"row {k} of the batch ", "the row ")
            return [("image_rows", message)]
        found: list[tuple[str, str]] = []
        for image in images:
            name = image.name.replace(f"row {k} of the batch, ", "")
            if self.processor is not None:
                rule = self._expansion(image.size)
                if isinstance(rule, str):
                    found.append(("image_rule", f"{name}: {rule}"))
                elif rule != (image.tokens, image.grid):
                    found.append(
                        (
                            "image_rule",
                            f"{name}: the {self.processor.family} processor makes a {image.size[1]}x{image.size[0]} "
                            f"image {rule[0]} tokens (grid {list(rule[1])}), the row holds {image.tokens} "
                            f"(grid {list(image.grid)})",
                        )
                    )
                elif not self.processor.pure and row.get("image_spans") is not None:
                    held = [int(t) for t in row["input_ids"][image.offset : image.offset + image.span]]
                    if held != self._expansion_ids(image.size):
                        found.append(
                            (
                                "image_rule",
                                f"{name}: tokens {image.offset} to {image.offset + image.span} of the row are not "
                                f"what the {self.processor.family} processor makes a "
                                f"{image.size[1]}x{image.size[0]} image",
                            )
                        )
            if self.check_files:
                now = self._size(image.ref)
                if now is None:
                    found.append(("image_file", f"{name} cannot be read now"))
                elif now != image.size:
                    found.append(
                        (
                            "image_size",
                            f"{name} is {now[1]}x{now[0]} now, {image.size[1]}x{image.size[0]} when packed",
                        )
                    )
        return found

    def _expansion(self, size: tuple[int, int]) -> tuple[int, tuple[int, ...]] | str:
        if size not in self._rule:
            assert self.processor is not None
            try:
                tokens = self.processor.measure(*size)
                self._rule[size] = (int(tokens.count), tuple(int(x) for x in tokens.grid))
            except RecordError as exc:
                self._rule[size] = exc.detail
        return self._rule[size]

    def _expansion_ids(self, size: tuple[int, int]) -> list[int]:
        """The token ids of an image's whole expansion (its text starts and ends with a marker token)."""
        if size not in self._ids:
            assert self.processor is not None
            if self._tokenizer is None:
                from packcli.tokenize.encoders.tokenizer import load_tokenizer

                self._tokenizer = load_tokenizer(self.processor.name)
            text = self.processor.measure(*size).text
            self._ids[size] = [int(t) for t in self._tokenizer(text, add_special_tokens=False)["input_ids"]]
        return self._ids[size]

    def _size(self, ref: ImageRef) -> tuple[int, int] | None:
        key = ref.path if ref.data is None else None
        if key is not None and key in self._sizes:
            return self._sizes[key]
        try:
            size: tuple[int, int] | None = image_size(ref)
        except RecordError:
            size = None
        if key is not None:
            self._sizes[key] = size
        return size


def image_checker(manifest: JSONObject, problems: list[str]) -> ImageChecker | None:
    """The check of an output's images: None for a text output (no processor, no image columns).

    A processor directory that cannot be loaded now is one problem of the manifest (appended to
    ``problems``); the other image checks still run.
    """
    processor = (manifest.get("tokenizer") or {}).get("processor")
    columns = manifest.get("columns")
    listed = isinstance(columns, list) and any(c in columns for c in IMAGE_COLUMNS)
    if not isinstance(processor, dict) and not listed:
        return None
    processor = processor if isinstance(processor, dict) else {}
    token_id = processor.get("image_token_id")
    if not isinstance(token_id, int):
        problems.append("has image columns but no tokenizer.processor.image_token_id")
        return None
    directory = processor.get("dir")
    checker = ImageChecker(token_id, str(directory) if isinstance(directory, str) else None)
    if checker.processor_problem is not None:
        problems.append(f"tokenizer.processor: {checker.processor_problem}")
    elif checker.processor is not None and processor.get("sha256") not in (None, checker.processor.identity()):
        problems.append(
            f"tokenizer.processor: the processor in {directory} is not the one the output was packed with "
            "(its sha256 differs); the images were checked against its rule all the same"
        )
    elif directory is None:
        problems.append("names no processor directory (tokenizer.processor.dir)")
    return checker


def image_columns(schema: Any, problems: list[str]) -> list[str]:
    """The image columns of a shard to read; a missing or mistyped one is a problem of the shard (appended to
    ``problems``; then none are read)."""
    kinds = dict(IMAGE_FIELDS)
    missing = [c for c in IMAGE_COLUMNS if c not in schema.names]
    if missing:
        problems.append(f"lacks the image column(s) {', '.join(missing)}")
        return []
    present = [c for c in kinds if c in schema.names]
    wrong = [f"{c} is {schema.field(c).type}, not {kinds[c]}" for c in present if schema.field(c).type != kinds[c]]
    if wrong:
        problems.append("has image columns of the wrong type: " + "; ".join(wrong))
        return []
    return present


def image_total_problems(manifest: JSONObject, held: dict[str, int]) -> list[str]:
    """The manifest's image counts (tokenizer.processor.images) against what the shards hold (``held``:
    samples, images, image_tokens, embedded); each difference is a problem of the manifest.

    They are counted from the rows as they are written (packcli.output.images.written_image_counts), so
    they equal the shards' whatever packing dropped, truncated, split or repeated.
    """
    counted = ((manifest.get("tokenizer") or {}).get("processor") or {}).get("images")
    if not isinstance(counted, dict):
        return []
    problems = []
    for key, value in held.items():
        if key in counted and counted[key] != value:
            what = "samples with images" if key == "samples" else key.replace("_", " ")
            if key == "embedded":
                what = "images that came as bytes"
            problems.append(f"counts {counted[key]} {what}, the shards hold {value}")
    return problems
