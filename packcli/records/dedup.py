"""The content key of a normalised record, for ``--dedup exact``.

Two records are the same content when their normalised samples are equal: the messages (roles and
contents, tools, the record's template arguments and training marks) of a chat record, the prompt
and completion, the text, or the token ids, whatever the raw bytes, field names or input format
they came from. The key is a 16-byte BLAKE2b of the sample's fields as canonical JSON (sorted keys);
the roles a record renamed (``renamed``) are how it was read, not what it holds, and are left out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

KEY_BYTES = 16


def _fields(sample: Any) -> dict[str, Any]:
    """The sample's fields but ``renamed``, as they are: JSON writes tuples as lists, as asdict's copy
    would be written, without copying every message first (this runs once per record, in the worker)."""
    return {f.name: getattr(sample, f.name) for f in dataclasses.fields(sample) if f.name != "renamed"}


def content_key(sample: Any) -> bytes:
    """The content key of a normalised sample, or of a preference record's members (``.samples``)."""
    members = getattr(sample, "samples", None)
    body = [_fields(m) for m in members] if members is not None else _fields(sample)
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_bytes_key)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=KEY_BYTES).digest()


def _bytes_key(value: Any) -> Any:
    """An image's bytes (packcli.records.images) stand in the key as their hash."""
    if isinstance(value, bytes):
        return {"bytes_blake2b": hashlib.blake2b(value, digest_size=KEY_BYTES).hexdigest()}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
