"""A JSON line decoded into a record, or the RecordError that says why it cannot be (not UTF-8, not
JSON, cut short at the end of a file, an integer too long or nesting too deep)."""

from __future__ import annotations

import json
from typing import Any

from packcli.errors import RecordError
from packcli.records.checks import (
    UNUSABLE,
    UnusableRecord,
    cut_last_line,
    ends_inside_value,
    found_at,
    integer_too_long,
    too_deep,
)


def parse_line(line: bytes) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError("invalid_utf8", f"byte {exc.start} of the line is not UTF-8; re-encode the file") from exc
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        if not line.endswith(b"\n") and ends_inside_value(text):  # only a file's last line lacks its newline
            raise cut_last_line(_json_error(text, exc)) from exc
        raise RecordError("invalid_json", f"invalid JSON ({_json_error(text, exc, found=True)})") from exc
    except ValueError as exc:  # the only other one: an integer past Python's digit limit
        raise integer_too_long() from exc
    except RecursionError as exc:  # the decoder recurses per nesting level
        raise too_deep() from exc
    if isinstance(record, dict) and UNUSABLE in record and isinstance(record[UNUSABLE], dict):
        raise UnusableRecord(record[UNUSABLE])  # an in-memory record JSON could not hold (checks.UNUSABLE)
    return record


def _json_error(text: str, exc: json.JSONDecodeError, found: bool = False) -> str:
    """Return what is wrong with a JSON line that does not decode, at the column of the record's text
    (``Expecting ',' delimiter at column 91``), and with ``found`` what is there (``, found 'oops}'``).

    The line is decoded with its newline (stripping it would copy every line), so an error found at
    the newline, as in a record cut short, is looked for again in the text without it.
    """
    record = text.rstrip("\r\n")
    if len(record) < len(text):
        try:
            json.loads(record)
        except json.JSONDecodeError as inner:
            exc = inner
    # Some of the decoder's messages end in "at" ("Unterminated string starting at"): say it once.
    where = f"{exc.msg.removesuffix(' at')} at column {exc.colno}"
    return f"{where}, {found_at(record, exc.pos)}" if found else where
