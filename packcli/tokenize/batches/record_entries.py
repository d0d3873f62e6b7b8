"""The entries a run writes of single records: one of the rejects file (where a record is, why it was
left out, and the record itself) and one of the --fix-turns-log file (where, what was changed, and the
record as read); a record longer than REJECT_RECORD_CHARS characters is given as its prefix in both."""

from __future__ import annotations

import json
from typing import Any, TypedDict

from packcli.config import flag_term
from packcli.errors import RecordError, render
from packcli.io.sources import RawBatch
from packcli.records import turns
from packcli.results import RejectEntry

REJECT_RECORD_CHARS = 100_000


# A reject's detail as text and Opt parts, beside the entry while it is in memory: an error about the
# record names the options in its reader's terms; the rejects file holds the text (``detail``).
DETAIL_PARTS = "detail_parts"


def reject(
    index: int, source: str, position: int, err: RecordError, raw: Any, raw_lines: bool, piece_index: int = 0
) -> dict[str, Any]:
    """One entry of the rejects file: where the record is, why it was left out, and the record itself.

    Every entry has the same keys. A record longer than REJECT_RECORD_CHARS characters is given as its
    prefix (``record_truncated`` true, ``record_chars`` its full length); its position finds it whole.
    ``piece_index`` is 0 but for a piece of a record split by ``--overflow split``. A later run
    recognises a rejects file it may replace by these keys (``packcli.results.REJECT_KEYS``).
    """
    text = record_text(raw, raw_lines)
    entry = RejectEntry(
        sample_index=index,
        piece_index=piece_index,
        source=source,
        position=position,
        unit="line" if raw_lines else "record",
        reason=err.reason,
        detail=render(err.parts, flag_term),  # the rejects file names options as the command line does
        record=text[:REJECT_RECORD_CHARS],
        record_truncated=len(text) > REJECT_RECORD_CHARS,
        record_chars=len(text),
    )
    return entry.to_dict()


def record_text(raw: Any, raw_lines: bool) -> str:
    """A raw record as the rejects file shows it: a JSON line as it was, other records as JSON text."""
    if raw_lines and isinstance(raw, bytes):
        return raw.decode("utf-8", errors="replace").rstrip("\n")
    return raw if isinstance(raw, str) else _record_text(raw)


def _record_text(record: Any) -> str:
    """The record as JSON text for the rejects file, even when it cannot be written as UTF-8 as is."""
    try:
        text = json.dumps(record, ensure_ascii=False, default=str)
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: keep it escaped, as it was in the input
        text = json.dumps(record, default=str)
    except RecursionError:
        text = "(nested too deep to show)"
    return text


class TurnFix(TypedDict):
    """One line of the --fix-turns-log file: where the record is, what was changed, and the record as read
    (its first characters when long, as in a rejects entry)."""

    sample_index: int
    source: str
    position: int
    unit: str  # line | record
    changes: list[turns.TurnChange]
    record: str
    record_truncated: bool
    record_chars: int


def fix_entry(
    index: int, source: str, position: int, changes: list[turns.TurnChange], raw: Any, batch: RawBatch
) -> TurnFix:
    """One entry of the --fix-turns-log file: where the record is, what was changed, and the record as read."""
    text = record_text(raw, batch.raw_lines)
    return {
        "sample_index": index,
        "source": source,
        "position": position,
        "unit": "line" if batch.raw_lines else "record",
        "changes": changes,
        "record": text[:REJECT_RECORD_CHARS],
        "record_truncated": len(text) > REJECT_RECORD_CHARS,
        "record_chars": len(text),
    }
