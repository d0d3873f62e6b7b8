"""Images in conversations: every form a record gives them in, turned into one kind of content part.

A record names its images in one of three ways, which may mix within a dataset:

- content parts holding the image: ``{"type": "image", "image": PATH_OR_BYTES}`` (also ``"path"``,
  ``"url"`` for a local path or ``file://`` URL, and ``{"type": "image_url", "image_url": {"url": ...}}``);
- the Hugging Face convention: parts ``{"type": "image"}`` without the image, and a record-level
  ``images`` list that the parts take in order;
- LLaVA/ShareGPT placeholders: ``<image>`` in a message's text, with an ``images`` list, each
  placeholder taking the next image.

An image is a path (absolute, or relative to the data file's folder), bytes, or a dict ``{"bytes",
"path"}`` as a Hugging Face ``datasets`` Image column stores it in Parquet and Arrow files. Every image
part of the normalised sample becomes ``{"type": "image", IMAGE_KEY: {"path": ABSOLUTE_PATH}}`` or
``{..., IMAGE_KEY: {"bytes": BYTES}}``: split pieces carry their own images, in their messages.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypedDict

from packcli.errors import RecordError
from packcli.jsontypes import ChatMessage, ContentPart, JSONObject
from packcli.records.formats import Sample

IMAGE_KEY = "packcli_image"  # the normalised part's image: {"path": str} or {"bytes": bytes}
PLACEHOLDER = "<image>"
IMAGES_FIELD = "images"
_PAYLOAD_KEYS = ("image", "path", "url", "image_url")


class ImageSource(TypedDict, total=False):
    """A record's image made one form (an image part's ``IMAGE_KEY``): an absolute path, or bytes."""

    path: str
    bytes: bytes


def _source(value: Any, base: str, where: str, remote: Callable[[str], bool]) -> ImageSource:
    """Return the normalised image of one value a record gives (a path, bytes, a {bytes, path} dict)."""
    if isinstance(value, dict):
        data = value.get("bytes")
        if isinstance(data, (bytes, bytearray, memoryview)) and len(data):
            return {"bytes": bytes(data)}
        value = value.get("url") if value.get("path") is None else value.get("path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        if not len(value):
            raise RecordError("image_unreadable", f"{where}: the image's bytes are empty")
        return {"bytes": bytes(value)}
    if not isinstance(value, str) or not value:
        raise RecordError("image_missing", f"{where}: no image path or bytes (got {_shown(value)})")
    if value.startswith("file://"):
        value = value[len("file://") :]
    elif remote(value) or value.startswith("data:"):
        raise RecordError(
            "image_remote",
            f"{where}: image {value[:80]} is not a local file; download the images and give their paths",
        )
    path = os.path.expanduser(value)
    if not os.path.isabs(path):
        path = os.path.join(base, path)
    return {"path": os.path.abspath(path)}


def _shown(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _payload(part: JSONObject) -> Any:
    """Return the image a part holds itself, or None (the Hugging Face convention: from ``images``)."""
    for key in _PAYLOAD_KEYS:
        value = part.get(key)
        if value is None:
            continue
        if key == "image_url" and isinstance(value, dict):
            return value.get("url")
        return value
    return None


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and (part.get("type") in ("image", "image_url") or IMAGE_KEY in part)


def attach_images(sample: Sample, record: Any, base: str, remote: Callable[[str], bool]) -> Sample:
    """Return the sample with every image part normalised (see the module's docstring).

    ``base`` is the folder relative paths are read from (the data file's); ``remote`` says whether a
    location is a URI (``packcli.io.uri.is_uri``), which is refused: images are read from local files.
    Raises RecordError
    ``image_count_mismatch`` when the parts and placeholders do not take exactly the record's
    ``images``, and the errors of an image that cannot be named.
    """
    if sample.kind != "chat" or not sample.messages:
        return sample
    listed = record.get(IMAGES_FIELD) if isinstance(record, dict) else None
    if listed is not None and not isinstance(listed, (list, tuple)):
        if hasattr(listed, "tolist"):
            listed = listed.tolist()
        else:
            raise RecordError("wrong_type", f"field '{IMAGES_FIELD}' must be a list of images, not {_shown(listed)}")
    listed = list(listed or [])
    placeholders = bool(listed) and not any(
        is_image_part(p) and _payload(p) is None
        for m in sample.messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
    )
    taken = 0
    changed = False
    messages: list[ChatMessage] = []

    def take(where: str) -> ImageSource:  # the next image of the record's list
        nonlocal taken
        if taken >= len(listed):
            raise RecordError(
                "image_count_mismatch",
                f"{where} asks for image {taken + 1} but the record's '{IMAGES_FIELD}' lists {len(listed)}; "
                "give one image per placeholder",
            )
        image = _source(listed[taken], base, f"image {taken + 1} of '{IMAGES_FIELD}'", remote)
        taken += 1
        return image

    for i, message in enumerate(sample.messages):
        content = message.get("content")
        parts: list[ContentPart] | None = None
        if isinstance(content, str):
            if placeholders and PLACEHOLDER in content:
                parts = _split_text(content, take, f"message {i}")
        elif isinstance(content, list):
            parts = []
            for part in content:
                if is_image_part(part):
                    payload = _payload(part)
                    image = (
                        _source(payload, base, f"message {i}", remote) if payload is not None else take(f"message {i}")
                    )
                    parts.append({"type": "image", IMAGE_KEY: image})
                elif placeholders and isinstance(part.get("text"), str) and PLACEHOLDER in part["text"]:
                    parts.extend(_split_text(part["text"], take, f"message {i}"))
                else:
                    parts.append(part)
            if parts == content:
                parts = None
        placed = parts if parts is not None else (content if isinstance(content, list) else [])
        if message.get("role") == "assistant" and any(is_image_part(p) for p in placed):
            # An answer is trained, and an image's tokens never are: the image's markers would be.
            raise RecordError(
                "image_in_answer",
                f"message {i} is an assistant message holding an image; images are never trained, so "
                "put the image in a user message",
            )
        if parts is None:
            messages.append(message)
        else:
            messages.append({**message, "content": parts})
            changed = True
    if taken != len(listed):
        raise RecordError(
            "image_count_mismatch",
            f"the record's '{IMAGES_FIELD}' lists {len(listed)} images but its messages place {taken}; "
            f"give one image part or {PLACEHOLDER} placeholder per image",
        )
    return replace(sample, messages=messages) if changed else sample


def _split_text(text: str, take: Any, where: str) -> list[ContentPart]:
    """Return a text's parts with each ``<image>`` placeholder turned into the next image's part."""
    out: list[ContentPart] = []
    pieces = text.split(PLACEHOLDER)
    for k, piece in enumerate(pieces):
        if k:
            out.append({"type": "image", IMAGE_KEY: take(where)})
        if piece:
            out.append({"type": "text", "text": piece})
    return out


def sample_images(sample: Sample) -> list[ImageSource]:
    """Return the sample's normalised images in message and part order."""
    return [
        p[IMAGE_KEY]
        for m in sample.messages or []
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and IMAGE_KEY in p
    ]
