"""Image references and their sizes, read from the file header (the pixels are not decoded)."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packcli.errors import RecordError

# EXIF orientations that turn the image by 90 or 270 degrees: the processor's loader applies them
# (PIL.ImageOps.exif_transpose), so the size the processor sees has width and height swapped.
_TURNED = {5, 6, 7, 8}
_ORIENTATION = 0x0112


@dataclass(frozen=True)
class ImageRef:
    """One image of a sample: a file (``path``, absolute or relative to the data file) or its bytes.

    ``path`` is what the record named, resolved against the data file's folder; ``data`` holds the
    bytes when the record carried them (a Parquet/Arrow image column). One of the two is set.
    """

    path: str | None = None
    data: bytes | None = None

    @property
    def label(self) -> str:
        """How messages name the image: its path, or ``<N bytes>``."""
        return self.path if self.path is not None else f"<{len(self.data or b'')} bytes>"


def image_size(ref: ImageRef) -> tuple[int, int]:
    """Return the image's (height, width) as the processor sees it, from the header only.

    The EXIF orientation is applied as the processors' loader applies it. Raises ``RecordError``
    naming the image when it cannot be opened or is not an image.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        source = io.BytesIO(ref.data) if ref.data is not None else Path(str(ref.path))
        with Image.open(source) as im:  # lazy: reads the header, not the pixels
            width, height = im.size
            # A PNG's EXIF may follow its pixels, and PIL decodes the whole image to look for it: look at
            # the chunk headers first, and ask PIL only when there is one (then exactly as the loader does).
            exif = im.format != "PNG" or _png_may_hold_exif(im.fp)
            orientation = im.getexif().get(_ORIENTATION, 1) if exif else 1
    except FileNotFoundError:
        raise RecordError(
            "image_missing",
            f"image {ref.label} does not exist; check the path (relative paths are read from the data file's folder)",
        ) from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise RecordError(
            "image_unreadable", f"image {ref.label} cannot be read as an image ({type(exc).__name__}); check the file"
        ) from None
    if orientation in _TURNED:
        width, height = height, width
    return height, width


_PNG_TEXT = (b"tEXt", b"zTXt", b"iTXt")
_RAW_EXIF = b"Raw profile type exif"  # EXIF kept in a text chunk, which PIL also reads


def _png_may_hold_exif(fh: Any) -> bool:
    """Return whether a PNG has an EXIF chunk (``eXIf``, or a raw-profile text chunk), reading chunk headers only.

    True also when the chunks cannot be walked to ``IEND`` (a cut file): then PIL decides, as it would.
    """
    at = fh.tell()
    try:
        fh.seek(8)  # the signature
        while True:
            head = fh.read(8)
            if len(head) < 8:
                return True
            length, kind = struct.unpack(">I4s", head)
            if kind == b"IEND":
                return False
            if kind == b"eXIf":
                return True
            skip = length + 4  # the chunk's data and its CRC
            if kind in _PNG_TEXT:
                key = fh.read(min(length, len(_RAW_EXIF) + 1))
                if key.split(b"\0")[0] == _RAW_EXIF:
                    return True
                skip -= len(key)
            fh.seek(skip, 1)
    finally:
        fh.seek(at)
