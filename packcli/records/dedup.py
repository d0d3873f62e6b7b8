"""The content key of a normalised record, for ``--dedup exact``.

Two records are the same content when their normalised samples are equal: the messages (roles and
contents, tools, the record's template arguments and training marks) of a chat record, the prompt
and completion, the text, or the token ids, whatever the raw bytes, field names or input format
they came from. The key is a 16-byte BLAKE2b of the sample's fields as canonical JSON (sorted keys);
the roles a record renamed (``renamed``) are how it was read, not what it holds, and are left out.

The JSON is written by ``orjson`` where it writes the same bytes as the standard library (a body of
strings, integers, booleans, nulls, lists and dicts with string keys: 9 us a chat record against 39), and
by ``json`` otherwise (a float, whose digits the two write differently; bytes; a lone surrogate; an
integer past 64 bits), so a key never depends on which wrote it, nor on whether ``orjson`` is installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

try:
    import orjson
except ImportError:  # a dependency, but an install without it keeps the same keys, written by json
    orjson = None  # type: ignore[assignment]

KEY_BYTES = 16

# The values orjson writes as json.dumps(sort_keys=True, ensure_ascii=False, separators=(",", ":")) does.
_SAME_SCALARS = frozenset({str, int, bool, type(None)})


def _fields(sample: Any) -> dict[str, Any]:
    """The sample's fields but ``renamed``, as they are: JSON writes tuples as lists, as asdict's copy
    would be written, without copying every message first (this runs once per record, in the worker)."""
    return {f.name: getattr(sample, f.name) for f in dataclasses.fields(sample) if f.name != "renamed"}


def content_key(sample: Any) -> bytes:
    """The content key of a normalised sample, or of a preference record's members (``.samples``)."""
    members = getattr(sample, "samples", None)
    body = [_fields(m) for m in members] if members is not None else _fields(sample)
    return hashlib.blake2b(canonical_json(body), digest_size=KEY_BYTES).digest()


def canonical_json(body: Any) -> bytes:
    """``body`` as canonical JSON (keys sorted, no spaces, non-ASCII text as it is), UTF-8 encoded."""
    if orjson is not None and _written_alike(body):
        try:
            return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a lone surrogate, an integer past 64 bits, nesting past 255
            pass
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_bytes_key)
    return text.encode("utf-8", "surrogatepass")


def _written_alike(body: Any) -> bool:
    """Whether ``body`` holds only values that orjson writes as json does: strings, integers, booleans and
    nulls, in lists, tuples and dicts with string keys (no float, no bytes, no other type)."""
    stack = [body]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _SAME_SCALARS:
            continue
        if kind is dict:
            if not all(type(key) is str for key in item):
                return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        else:
            return False
    return True


def _bytes_key(value: Any) -> Any:
    """An image's bytes (packcli.records.images) stand in the key as their hash."""
    if isinstance(value, bytes):
        return {"bytes_blake2b": hashlib.blake2b(value, digest_size=KEY_BYTES).hexdigest()}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
