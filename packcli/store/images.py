"""The token store's image table: per stored sample with images, what its images are and where.

A run with a processor writes ``images.jsonl`` into the store: one JSON line per sample that has
images, ``{"sample": N, "images": [...]}`` with N the sample's number in the store and, per image,
``path`` (absolute, or null for bytes), ``bytes_b64`` (the bytes, base64, when the record carried
them), ``size`` [height, width], ``grid``, ``tokens`` (image tokens), ``offset`` (its first token in
the sample), ``span`` (the tokens of its expansion) and ``stat`` [bytes, mtime_ns, inode, ctime_ns] of its
file, the stamp data files have (``io.fingerprint.file_stamp``): a copy that restores size and mtime is seen.
A store without images has no such file: text-only stores are unchanged.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from packcli.io.fingerprint import file_stamp
from packcli.results import ImageRecord

IMAGES_FILE = "images.jsonl"


def image_line(sample: int, images: tuple[ImageRecord, ...]) -> str:
    """Return one line of the image table."""
    out = []
    for image in images:
        entry = {k: v for k, v in image.items() if k != "bytes"}
        if image.get("bytes") is not None:
            entry["bytes_b64"] = base64.b64encode(image["bytes"]).decode("ascii")
        out.append(entry)
    return json.dumps({"sample": sample, "images": out}, separators=(",", ":"))


def load_images(store_path: str | Path) -> dict[int, list[ImageRecord]]:
    """Return the store's image table by sample number (empty when the store has none)."""
    path = Path(store_path) / IMAGES_FILE
    if not path.is_file():
        return {}
    table: dict[int, list[ImageRecord]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            entry = json.loads(line)
            images = entry["images"]
            for image in images:
                if "bytes_b64" in image:
                    image["bytes"] = base64.b64decode(image.pop("bytes_b64"))
            table[int(entry["sample"])] = images
    return table


def changed_image(table: dict[int, list[ImageRecord]]) -> str | None:
    """Return the path of an image file whose size or modification time differs from the table's, or None."""
    seen: set[str] = set()
    for images in table.values():
        for image in images:
            path = image.get("path")
            if path is None or path in seen:
                continue
            seen.add(path)
            try:
                stamp = file_stamp(path)
            except OSError:
                return str(path)
            if image.get("stat") != stamp:  # a store made before inode and ctime were stamped: a miss
                return str(path)
    return None
