"""A conversation with images to token ids and labels, exactly as the model's processor gives them.

The conversation is rendered by the processor's chat template with each image part as
``{"type": "image"}``; the k-th image token in the rendered text is replaced by what the k-th image
becomes (``VisionProcessor.measure`` of its size: ``ImageTokens.text``), the trained character spans
are moved by the same amounts, and the text is encoded as the processor encodes it
(``tokenizer(text)``, special tokens added unless the text starts with the BOS token, as
``ProcessorMixin.apply_chat_template`` does). No token of an image's expansion is ever trained.

Each image of the sample is recorded (``Encoded.images``): its reference, size, grid, token count,
the offset of its first token in the sample, the tokens of its expansion, and the file's size and
modification time (a cache entry whose images changed is made again).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from packcli.errors import RecordError
from packcli.io.fingerprint import file_stamp
from packcli.records.formats import Sample
from packcli.records.images import ImageSource, sample_images
from packcli.results import ImageRecord


def image_info(image: ImageSource) -> tuple[Any, ImageRecord]:
    """Return the vision ImageRef of a normalised image and its record (ref, stat) without the size."""
    from packcli.vision import ImageRef

    path = image.get("path")
    if path is not None:
        ref = ImageRef(path=path)
        try:
            stat = file_stamp(path)
        except OSError:
            stat = None
        return ref, {"path": path, "stat": stat}
    return ImageRef(data=image["bytes"]), {"path": None, "bytes": image["bytes"]}


def _size(ref: Any, record: ImageRecord) -> tuple[int, int]:
    stat = record.get("stat")
    if record.get("path") is None or stat is None:
        from packcli.vision import image_size

        return image_size(ref)
    return _file_size(record["path"], *stat)  # ref is ImageRef(path=record["path"]) (image_info)


# By (path, *stamp): an image file named by several samples is sized once per process (sizing a PNG
# reads its whole file, for an EXIF chunk after the pixels).
@functools.lru_cache(maxsize=100_000)
def _file_size(path: str, *stat: Any) -> tuple[int, int]:
    from packcli.vision import ImageRef, image_size

    return image_size(ImageRef(path=path))


def _places(text: str, token: str) -> list[int]:
    at, out = text.find(token), []
    while at >= 0:
        out.append(at)
        at = text.find(token, at + len(token))
    return out


class Encoded(tuple[np.ndarray, np.ndarray]):
    """(input_ids, labels) of a sample with images, and its images (``images``: one record each); or of a
    conversation whose trained turns have reasoning (``reasoning``: a ``chat_template.Reasoning``)."""

    images: tuple[ImageRecord, ...] = ()
    reasoning: Any = None


@dataclass
class Expanded:
    """A rendered conversation with each image placeholder replaced by what the image becomes."""

    text: str
    spans: list[tuple[int, int]]  # the trained character spans, moved
    places: list[tuple[int, int]]  # each image's characters in ``text``
    records: list[ImageRecord]  # each image's record (without its offset, known once encoded)


def expand_images(vision: Any, sample: Sample, text: str, spans: list[tuple[int, int]]) -> Expanded:
    """Return the rendered ``text`` with its k-th image token replaced by the k-th image's expansion.

    Raises TokenizerError for a family whose images are not packed (``VisionProcessor.check_packable``),
    RecordError ``image_count_mismatch`` when the text's image tokens are not one per image,
    and the image's own errors (missing, unreadable, refused by the processor) naming it.
    """
    token = vision.image_token
    images = sample_images(sample)
    if images:
        vision.check_packable()
    at = _places(text, token)
    if len(at) != len(images):
        raise RecordError(
            "image_count_mismatch",
            f"the rendered conversation has {len(at)} image placeholders ({token}) for {len(images)} images; "
            "give one image per image part, and no image token in the text",
        )
    parts: list[str] = []
    places: list[tuple[int, int]] = []
    records: list[ImageRecord] = []
    shifts: list[tuple[int, int]] = []  # (end of a placeholder in the rendered text, characters added up to it)
    prev, added = 0, 0
    for k, (place, image) in enumerate(zip(at, images, strict=True)):
        ref, record = image_info(image)
        try:
            height, width = _size(ref, record)
            tokens = vision.measure(height, width)
        except RecordError as err:
            raise RecordError(err.reason, f"image {k + 1}: ", *err.parts) from None
        parts.append(text[prev:place])
        start = place + added
        parts.append(tokens.text)
        places.append((start, start + len(tokens.text)))
        added += len(tokens.text) - len(token)
        prev = place + len(token)
        shifts.append((prev, added))
        record.update({"size": [height, width], "grid": list(tokens.grid), "tokens": tokens.count})
        records.append(record)
    parts.append(text[prev:])

    def moved(p: int) -> int:
        shift = 0
        for end, total in shifts:
            if p < end:
                break
            shift = total
        return p + shift

    return Expanded("".join(parts), [(moved(a), moved(b)) for a, b in spans], places, records)


def image_tokens_masked(
    enc: Any, ids: np.ndarray, mask: np.ndarray, expanded: Expanded, image_token_id: int
) -> tuple[ImageRecord, ...]:
    """Untrain every token of each image's expansion; return the images' records with their offsets."""
    for k, ((a, b), record) in enumerate(zip(expanded.places, expanded.records, strict=True)):
        first, last = enc.char_to_token(a), enc.char_to_token(b - 1)
        if first is None or last is None:
            raise RecordError("image_tokens_mismatch", f"image {k + 1}: its tokens cannot be located in the text")
        mask[first : last + 1] = False
        found = int(np.count_nonzero(ids[first : last + 1] == image_token_id))
        if found != record["tokens"]:
            raise RecordError(
                "image_tokens_mismatch",
                f"image {k + 1} becomes {found} image tokens, its processor says {record['tokens']}",
            )
        record.update({"offset": first, "span": last + 1 - first})
    return tuple(expanded.records)


def window_cuts_image(images: tuple[ImageRecord, ...], length: int, limit: int, side: str) -> bool:
    """Return whether cutting a sample of ``length`` tokens to ``limit`` (from ``side``) cuts an image."""
    if length <= limit:
        return False
    lo, hi = (length - limit, length) if side == "left" else (0, limit)
    return any(im["offset"] < lo or im["offset"] + im["span"] > hi for im in images)
