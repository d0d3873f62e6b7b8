"""One field of a record, read and checked: present and not null, a string, a list of 64-bit integers,
or JSON text in a cell (CSV cells and some exports carry lists as JSON); each refusal a ``RecordError``
naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from packcli.errors import RecordError, too_many_digits
from packcli.jsontypes import Record

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def tname(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def require(record: Record, key: str) -> Any:
    if key not in record:
        raise RecordError("missing_field", f"the record has no field '{key}' (it has: {', '.join(map(str, record))})")
    value = record[key]
    if value is None:
        raise RecordError("wrong_type", f"field '{key}' is null")
    return value


def string(record: Record, key: str) -> str:
    value = require(record, key)
    if not isinstance(value, str):
        raise RecordError("wrong_type", f"field '{key}' must be a string, not {tname(value)}")
    return value


def int_list(value: Any, key: str) -> list[int]:
    if isinstance(value, str):
        value = json_cell(value, key, "a list of integers")
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RecordError("wrong_type", f"field '{key}' must be a list of integers")
    if value and not INT64_MIN <= min(value) <= max(value) <= INT64_MAX:
        # JSON integers have no size limit; token ids and labels are machine integers.
        big = next(v for v in value if not INT64_MIN <= v <= INT64_MAX)
        shown = str(big) if len(str(big)) <= 30 else str(big)[:27] + "..."
        raise RecordError("integer_out_of_range", f"field '{key}' holds {shown}, beyond the 64-bit integer range")
    return value


def json_cell(value: str, key: str, expected: str) -> Any:
    # CSV cells and some exports carry lists as JSON text.
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise RecordError(
            "wrong_type",
            f"field '{key}' must be {expected}; it is a string that is not valid JSON "
            f"({exc.msg} at character {exc.pos})",
        ) from exc
    except ValueError as exc:  # the only other one: an integer past Python's digit limit
        raise RecordError(
            "integer_out_of_range", f"field '{key}' holds {too_many_digits()}; write it as a string"
        ) from exc
    except RecursionError as exc:  # the decoder recurses per nesting level
        raise RecordError("too_deep", f"field '{key}' nests too deep to decode") from exc
