"""Checks of decoded record values that JSON allows but that cannot be tokenized or written back.

JSON may escape half of a UTF-16 surrogate pair (``"\\ud800"``): Python decodes it to a string that
has no UTF-8 form, which the tokenizer rejects for the whole batch. JSON may also nest arbitrarily
deep, while Python's decoder (and every recursive walk after it) stops near its recursion limit.
Both are found here, per record, so that they are one counted reason instead of a traceback.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from packcli.errors import RecordError, too_many_digits
from packcli.records.formats import Sample

# Far deeper than any real record (chat messages with tool calls nest under 10 levels), and far below
# the recursion limit of the decoder and of the template renderer.
MAX_DEPTH = 100
# A JSON escape of a surrogate (\uD800-\uDFFF, either case): the only way a line's text holds a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_STRUCTURE = re.compile(r'["\[\]{}]')
_IN_STRING = re.compile(r'["\\]')
_SCALAR_END = re.compile(r"[\s,\]]")


def too_deep() -> RecordError:
    return RecordError("too_deep", f"the record nests more than {MAX_DEPTH} levels deep")


def integer_too_long() -> RecordError:
    # Python refuses to convert integers this long (a guard against slow conversions): JSON has no
    # limit, so a record may hold one, which is then this reason rather than a traceback.
    return RecordError("integer_out_of_range", f"the record holds {too_many_digits()}; write it as a string")


def cut_last_line(why: str) -> RecordError:
    # A JSON line with no newline that ends inside its record is the file's last line, cut short (a copy
    # or a download that stopped); a JSON array cut short has this reason too.
    return RecordError(
        "truncated_file", f"the file looks cut (a truncated copy?): its last line ends inside the record ({why})"
    )


# The characters of a line an invalid JSON error quotes from where the decoder stopped (``found_at``).
EXCERPT_CHARS = 30


def found_at(text: str, pos: int) -> str:
    """Return the words that say what a JSON decoder met at ``pos`` of ``text``: the rest of that line,
    quoted, at most ``EXCERPT_CHARS`` characters (``found 'hello, world'``), or the line's end."""
    rest = text[pos:].split("\n", 1)[0].rstrip("\r")
    if not rest.strip():
        return "found the end of the line"
    excerpt = rest[:EXCERPT_CHARS] + ("..." if len(rest) > EXCERPT_CHARS else "")
    return f"found {excerpt!r}"


def ends_inside_value(text: str) -> bool:
    """Return True when JSON text ends inside its first value: a string or a bracket still open.

    Only strings and brackets are followed (``json_value_end``, the JSON array reader's scan): a line
    that closes its value and is still invalid is not cut, however it ends.
    """
    pos = len(text) - len(text.lstrip())
    return pos < len(text) and json_value_end(_WholeText(text), pos) is None


class GrowingText(Protocol):
    """Text that may grow at its end on demand (``more``), as a stream is read by chunks."""

    buf: str

    def more(self) -> bool:
        """Append more text to ``buf``; return False at the end."""
        ...


class _WholeText:
    def __init__(self, text: str) -> None:
        self.buf = text

    def more(self) -> bool:
        return False


def json_value_end(stream: GrowingText, pos: int) -> int | None:
    """Return the end of the JSON value that starts at ``pos`` (reading on as needed), or None if cut off.

    Only brackets and strings are followed, so a value nested deeper than the decoder can go is still
    delimited, and the scan goes on across chunks without starting over.
    """
    first = stream.buf[pos]
    if first not in '[{"':
        while True:
            m = _SCALAR_END.search(stream.buf, pos)
            if m:
                return m.start()
            if not stream.more():
                return len(stream.buf)
    depth = 0
    in_string = False
    i = pos
    while True:
        if in_string:
            m = _IN_STRING.search(stream.buf, i)
            if m is None:
                i = len(stream.buf)
            elif m.group() == "\\":
                if m.end() >= len(stream.buf):  # the escaped character is in the next chunk
                    i = m.start()
                    if not stream.more():
                        return None
                    continue
                i = m.end() + 1
                continue
            else:
                in_string = False
                i = m.end()
                if depth == 0:
                    return i
                continue
        else:
            m = _STRUCTURE.search(stream.buf, i)
            if m is None:
                i = len(stream.buf)
            else:
                c = m.group()
                i = m.end()
                if c == '"':
                    in_string = True
                elif c in "[{":
                    depth += 1
                else:
                    depth -= 1
                    if depth == 0:
                        return i
                continue
        if not stream.more():
            return None


def check_value(value: Any, what: str = "the record") -> None:
    """Raise RecordError if any string in ``value`` has a lone surrogate, or it nests too deep.

    Iterative, so that the walk itself has no depth limit. ASCII strings cost nothing (``isascii`` is
    a flag lookup); others are encoded once.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                _check_text(item, what)
        elif isinstance(item, dict):
            if depth >= MAX_DEPTH:
                raise too_deep()
            stack.extend((k, depth + 1) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            if depth >= MAX_DEPTH:
                raise too_deep()
            stack.extend((v, depth + 1) for v in item)


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise RecordError(
            "lone_surrogate",
            f"{what} holds a lone surrogate \\u{code:04x} (half of a UTF-16 pair, not text)",
        ) from exc


def raw_line_is_clean(line: bytes) -> bool:
    """Return True when a JSON line certainly decodes to values that ``check_sample`` accepts.

    A lone surrogate can only come from a ``\\uD800``-``\\uDFFF`` escape, since UTF-8 bytes cannot encode
    one; and no value nests deeper than the line has brackets and braces. Both tests are byte scans,
    far cheaper than walking the decoded record; a line that fails them is checked in full.
    Values parsed again from strings (a tools cell given as JSON text) are covered: their escapes and
    brackets are in the line too. The escapes of the characters just below the surrogates (Hangul
    syllables written ASCII-only, ``\\uD000``-``\\uD7FF``) pass.
    """
    return _SURROGATE_ESCAPE.search(line) is None and len(line) - len(line.translate(None, b"{[")) <= MAX_DEPTH


def check_sample(sample: Sample) -> None:
    """Check every value of a normalised sample that reaches the template or the tokenizer."""
    if sample.messages is not None:
        check_value(sample.messages, "a message")
    if sample.tools is not None:
        check_value(sample.tools, "a tool")
    if sample.template_kwargs is not None:
        check_value(sample.template_kwargs, "chat_template_kwargs")
    for name in ("text", "prompt", "completion"):
        value = getattr(sample, name)
        if value is not None:
            check_value(value, f"the {name}")


# A record given in memory (a list of dicts to the library) that JSON cannot carry as it is (bytes, an
# array) is written to the records file as {UNUSABLE: {"reason", "detail", "record"}}, and the worker
# that reads that line rejects it with this reason: counted under --on-error skip like any bad record,
# where turning the value into its repr (b'...', "[1 2 3]") packed the wrong text or said the wrong thing.
UNUSABLE = "\u0000packcli-unusable-record"


class UnusableRecord(RecordError):
    """The RecordError of a line written for an unusable in-memory record; ``record`` is that record as text."""

    def __init__(self, line: dict[str, Any]) -> None:
        super().__init__(str(line.get("reason")), str(line.get("detail")))
        self.record = str(line.get("record"))


def unusable_value(record: Any) -> RecordError | None:
    """Return the RecordError for the first value of an in-memory record that JSON cannot hold as it is.

    Bytes are not decoded (they name no encoding, and may not be text at all); arrays (numpy, or any
    object with ``__array__``) are not converted: both say what to pass instead.
    """
    stack: list[tuple[Any, str, int]] = [(record, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, (bytes, bytearray, memoryview)):
            return RecordError(
                "bytes_value",
                f"{_place(where)} holds bytes, not text; decode them (value.decode('utf-8')) before packing",
            )
        if hasattr(item, "__array__") and not isinstance(item, (str, list, tuple, dict)):
            kind = f"{type(item).__module__.split('.')[0]}.{type(item).__name__}"
            return RecordError(
                "array_value",
                f"{_place(where)} holds a {kind} (an array type), not a JSON value; pass plain Python values "
                "(value.tolist())",
            )
        if depth >= MAX_DEPTH:
            continue
        if isinstance(item, dict):
            stack.extend((v, f"{where}[{k!r}]" if where else repr(k), depth + 1) for k, v in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in reversed(list(enumerate(item))))
    return None


def _place(where: str) -> str:
    field, _, rest = where.partition("[")
    return f"field {field}" + (f" at [{rest}" if rest else "")
