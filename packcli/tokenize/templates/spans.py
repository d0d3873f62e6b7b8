"""Where each assistant answer is in a rendered conversation, for templates without ``{% generation %}`` blocks.

The rule (docs/explanation/answer-spans.md states it too): assistant message i is trained from the end
of its role header (what the template's generation prompt puts before an answer) through the template's
end-of-turn marker, as the template renders message i **in the whole conversation**. Everything the
model would generate after the generation prompt is trained: reasoning where the template shows it,
the answer, tool calls, any channel or think tags around them. Whitespace after the marker, the next
role's header, and all system, user and tool text are not.

The spans are found in four steps, none of which needs the template to render a conversation prefix
the way it renders the whole (real templates do not: Qwen3 and DeepSeek drop earlier reasoning,
gpt-oss ends the last answer with ``<|return|>`` and earlier ones with ``<|end|>``):

1. **The body**, by difference: the conversation is rendered again with message i's text fields
   perturbed (a private-use character between every two characters). The first and last characters
   where the two renderings differ bound what the template made of message i, whatever it does to the
   text on the way (trimming, splitting reasoning off, dropping it).
2. **The start**: the nearest occurrence before the body of the template's assistant header (the
   generation prompt, or the longest part of it that the template also renders in history).
3. **The end**: the first end-of-turn marker after the body. The markers, and the header of step 2,
   are learned once per template from probe conversations (what follows an answer in history and at
   the end of the conversation): the template's shape, ``packcli.tokenize.templates.template_shape``.
4. **Other messages' text** inside a span (a tool's output that the template renders in the turn of
   the answer that called it) is cut out, found character by character with marks in those messages.

Steps 1 and 4 usually share one rendering: the answers perturbed and the other messages marked at once.
When that rendering is the conversation with marks inserted and nothing else changed, it tells both
where the answers are and where every other message's characters are, and the spans that hold none of
them are final; only a span that holds some costs more renderings (to cut them out). Otherwise (the
template branched on or transformed marked text) the answers and the other messages are each found in
renderings of their own, as if that shared one had not been made.

A span that cannot be found this way is a RecordError with a reason, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence

from packcli.errors import RecordError, first_line
from packcli.jsontypes import ChatMessage
from packcli.tokenize.templates.span_marks import OWN_MARK, answer_marks, expand, mark_runs, marked_message, perturb
from packcli.tokenize.templates.template_shape import Render, TemplateShape, common_prefix

# Separators shorter than this between two answers are too likely to occur inside an answer.
_MIN_SEPARATOR = 24


def assistant_spans(
    render: Render,
    messages: list[ChatMessage],
    full: str,
    which: Sequence[int],
    shape: TemplateShape,
) -> list[tuple[int, int]]:
    """Return the character span in ``full`` of each assistant message listed in ``which``.

    ``full`` is ``render(messages, False)``. Raises RecordError ``template_spans_not_found`` when a
    span cannot be located with certainty.
    """
    spans: list[tuple[int, int]] = []
    previous_end = 0
    others = [k for k, m in enumerate(messages) if m.get("role") != "assistant"]
    marked = _marked_at_once(render, messages, full, which, others)
    if marked is None:
        bodies = _bodies_at_once(render, messages, full, which)
    else:
        bodies = _bodies_in(full, marked[0], messages, which)
    bodies = bodies or [_body(render, messages, full, i) for i in which]
    runs_on = False  # the previous answer's text runs into this one's, nothing between them
    for n, (i, (body_start, body_end)) in enumerate(zip(which, bodies, strict=True)):
        limit = bodies[n + 1][0] if n + 1 < len(bodies) else len(full)
        start = body_start if runs_on else _header_end(full, previous_end, body_start, shape)
        if start is None:
            start = _prompt_end(render, messages, full, i, previous_end, body_start)
        if start is None:
            raise _not_found(i, "its role header is not where the template's generation prompt says")
        end = _marker_end(full, body_end, limit, shape)
        # No end marker, and the next answer follows at once (its text, or its role header then its text):
        # the template leaves this answer's turn open (Gemma 4 renders a call, the tool's response, then
        # the calling answer's text in one turn). The answer ends with its own last character.
        gap = full[body_end:limit] if end is None and limit < len(full) else None
        runs_on = gap == ""
        if gap in ("", shape.header):
            end = body_end
        if end is None:
            raise _not_found(i, "no end-of-turn marker follows it")
        if start < previous_end or end > limit:
            raise _not_found(i, "it overlaps another assistant message")
        spans.append((start, end))
        previous_end = end
    return _without_other_messages(render, messages, full, which, spans, shape, None if marked is None else marked[1])


def _marked_at_once(
    render: Render, messages: list[ChatMessage], full: str, which: Sequence[int], others: Sequence[int]
) -> tuple[str, list[tuple[int, int]]] | None:
    """Return one rendering's answers and other messages' runs of characters, or None when unsure.

    Every answer in ``which`` is perturbed with its own mark (as ``_bodies_at_once`` does) and every
    message in ``others`` is marked (as ``_positions`` does), in one rendering. Returned: that rendering
    without the other messages' marks (what ``_bodies_at_once`` compares with ``full``), and the
    [start, end) runs of ``full`` that the other messages' characters take. None when the rendering,
    without any mark, is not ``full``: the template branched on a marked text or transformed it, and
    the answers and the other messages must each be found in renderings of their own.
    """
    marks = answer_marks(len(which))
    if not which or OWN_MARK in full or any(mark in full for mark in marks):
        return None
    changed = list(messages)
    for mark, i in zip(marks, which, strict=True):
        changed[i] = perturb(messages[i], 0, mark)
    for k in others:
        changed[k] = marked_message(messages[k])
    try:
        other = render(changed, False)
    except Exception:
        return None
    foreign = other
    for mark in marks:
        foreign = foreign.replace(mark, "")
    if foreign.replace(OWN_MARK, "") != full:
        return None
    return other.replace(OWN_MARK, ""), mark_runs(foreign)


def _bodies_in(
    full: str, other: str, messages: list[ChatMessage], which: Sequence[int]
) -> list[tuple[int, int]] | None:
    """Return the answers' bodies from ``other`` (``full`` with the answers' marks inserted), or None.

    Several answers: as ``_bodies_at_once`` finds them. One answer: as ``_body`` finds it, when its
    perturbation there is the one ``_body`` makes first (text to mark, no number or boolean to change).
    """
    if len(which) >= 2:
        return _bodies_from(full, other, answer_marks(len(which)))
    mark = answer_marks(1)[0]
    message = messages[which[0]]
    if perturb(message, 0, mark, scalars=True) != perturb(message, 0, mark):
        return None
    body = _difference(full, other)
    return None if body is None else [body]


def _without_other_messages(
    render: Render,
    messages: list[ChatMessage],
    full: str,
    which: Sequence[int],
    spans: list[tuple[int, int]],
    shape: TemplateShape,
    runs: list[tuple[int, int]] | None = None,
) -> list[tuple[int, int]]:
    """Return ``spans`` with the text of the other messages cut out (a span may become several).

    Some templates render a tool's output inside the turn of the answer that called it (Gemma 4: the
    call, the tool's response, then the answer's text, then one end marker). What the model generates
    there is the call through its end marker, and the text after the response: the response, and the
    template text around it up to the answer's next character, are not trained. When the cut cannot be
    made with certainty (the template transforms the text, or no end marker closes the call before the
    response), the record is dropped rather than mislabelled. ``runs``: where the other messages'
    characters are in ``full``, when ``_marked_at_once`` found them; otherwise they are found here.
    """
    others = [k for k, m in enumerate(messages) if m.get("role") != "assistant"]
    if not others or not spans:
        return spans
    if runs is not None:
        if not any(a < end and start < b for a, b in runs for start, end in spans):
            return spans  # no other message's character inside any span: nothing to cut
        foreign: list[int] | None = expand(runs)
    else:
        foreign = _positions(render, messages, full, others)
    if foreign is None:
        foreign = _positions_one_by_one(render, messages, full, others, which, spans)
    out: list[tuple[int, int]] = []
    for i, (start, end) in zip(which, spans, strict=True):
        inside = [p for p in foreign if start <= p < end]
        if not inside:
            out.append((start, end))
            continue
        own = _positions(render, messages, full, [i])
        if own is None:
            raise _not_found(i, "another message's text is rendered inside it, and its own text cannot be told apart")
        out.extend(_cut_out(full, i, start, end, set(own), inside, shape))
    return out


def _positions_one_by_one(
    render: Render,
    messages: list[ChatMessage],
    full: str,
    others: Sequence[int],
    which: Sequence[int],
    spans: list[tuple[int, int]],
) -> list[int]:
    """Return the other messages' positions, found message by message (a template transformed some text).

    A message whose characters cannot be found one by one is bounded by difference instead: when that
    bound overlaps a span, the record is dropped.
    """
    found: list[int] = []
    for k in others:
        positions = _positions(render, messages, full, [k])
        if positions is not None:
            found.extend(positions)
            continue
        try:
            low, high = _body(render, messages, full, k)
        except RecordError:
            continue  # not rendered at all
        for i, (start, end) in zip(which, spans, strict=True):
            if low < end and start < max(high, low + 1):
                raise _not_found(i, f"message {k} is rendered inside it, transformed, so it cannot be cut out")
    return sorted(found)


def _cut_out(
    full: str, i: int, start: int, end: int, own: set[int], inside: list[int], shape: TemplateShape
) -> list[tuple[int, int]]:
    """Return the pieces of [start, end) without the other messages' characters ``inside`` it."""
    pieces = []
    position = start
    k = 0
    while k < len(inside):
        first = inside[k]
        mine_before = [p for p in own if position <= p < first]
        if not mine_before:
            raise _not_found(i, "another message's text is rendered inside it before its own text")
        after_mine = max(mine_before) + 1
        ends = [at + len(m) for m in shape.end_markers if (at := full.find(m, after_mine, first)) >= 0]
        if not ends:
            raise _not_found(i, "another message's text is rendered inside it, with no end marker before it")
        pieces.append((position, min(ends)))
        mine_after = [p for p in own if first < p < end]
        if not mine_after:
            return pieces
        position = min(mine_after)
        while k < len(inside) and inside[k] < position:
            k += 1
    pieces.append((position, end))
    return pieces


def _positions(render: Render, messages: list[ChatMessage], full: str, which: Sequence[int]) -> list[int] | None:
    """Return the positions in ``full`` of the characters of the messages in ``which`` (sorted), or None.

    The messages are rendered with a mark between every two characters of their text (and before a
    one-character text), which trimming cannot remove; when the rendering without the marks is not
    ``full`` (the template branched on the text or transformed it), the positions are unknown.
    """
    if OWN_MARK in full:
        return None
    changed = list(messages)
    for k in which:
        changed[k] = marked_message(messages[k])
    try:
        other = render(changed, False)
    except Exception:
        return None
    if other.replace(OWN_MARK, "") != full:
        return None
    return expand(mark_runs(other))


def _bodies_at_once(
    render: Render, messages: list[ChatMessage], full: str, which: Sequence[int]
) -> list[tuple[int, int]] | None:
    """Return the bodies of all messages in ``which`` from one rendering, or None when unsure.

    Every listed message is perturbed with its own mark; the bodies are read from that rendering by
    ``_bodies_from``. When they cannot be (the template branched on the perturbed text, or the
    separator is short or repeated), the caller falls back to one rendering per message.
    """
    if len(which) < 2:
        return None
    changed = list(messages)
    marks = answer_marks(len(which))
    if any(mark in full for mark in marks):
        return None  # the text itself holds one of the marks: they could not be told apart
    for mark, i in zip(marks, which, strict=True):
        changed[i] = perturb(messages[i], 0, mark)
    try:
        other = render(changed, False)
    except Exception:
        return None
    return _bodies_from(full, other, marks)


def _bodies_from(full: str, other: str, marks: list[str]) -> list[tuple[int, int]] | None:
    """Return the bodies of the messages perturbed with ``marks`` in ``other``, or None when unsure.

    Between the marks of two messages, ``other`` has the template text (and the unperturbed messages)
    that separate them; that text must appear exactly once in ``full`` after the previous body, and its
    position there ends the body.
    """
    firsts = [other.find(m) for m in marks]
    lasts = [other.rfind(m) for m in marks]
    if min(firsts) < 0 or any(lasts[k] >= firsts[k + 1] for k in range(len(marks) - 1)):
        return None
    start = common_prefix(full, other)
    if start > firsts[0]:
        return None
    bodies = []
    for k in range(len(marks)):
        if k + 1 < len(marks):
            separator = other[lasts[k] + 1 : firsts[k + 1]]
            end = full.find(separator, start)
            if len(separator) < _MIN_SEPARATOR or end < 0 or full.find(separator, end + 1) >= 0:
                return None
            bodies.append((start, end))
            start = end + len(separator)
        else:
            tail = other[lasts[k] + 1 :]
            end = len(full) - len(tail)
            if end < start or not full.endswith(tail):
                return None
            bodies.append((start, end))
    return bodies


def _body(render: Render, messages: list[ChatMessage], full: str, i: int) -> tuple[int, int]:
    """Return the span of ``full`` that depends on message i's own text (it may be empty)."""
    for empty in (0, 1, 2):
        changed = list(messages)
        changed[i] = perturb(messages[i], empty, scalars=True)
        try:
            other = render(changed, False)
        except Exception as exc:  # the template may reject the perturbed text (raise_exception)
            first = first_line(exc, limit=160)
            raise _not_found(i, f"the template rejects it with other text ({first})") from exc
        body = _difference(full, other)
        if body is not None:
            return body
    raise _not_found(i, "the template does not render it")


def _difference(full: str, other: str) -> tuple[int, int] | None:
    """Return the span of ``full`` where ``other`` differs from it (None when they are equal)."""
    if other == full:
        return None
    head = common_prefix(full, other)
    tail = _common_suffix(full, other, limit=min(len(full), len(other)) - head)
    if len(full) - tail > head:
        return head, len(full) - tail
    # Text was only inserted (an empty value made non-empty): where is ambiguous when the text
    # around the insertion repeats it ("<" before "<arg_key>" and "</tool_call>"), so take
    # the earliest place, never one inside the template text that follows.
    early = len(full) - _common_suffix(full, other, limit=min(len(full), len(other)))
    return min(head, early), min(head, early)


def _header_end(full: str, low: int, body_start: int, shape: TemplateShape) -> int | None:
    """Return where the assistant header before ``body_start`` ends (None when there is none)."""
    header = shape.header
    if not header:
        return body_start
    # Never a prefix shorter than what the probes showed in history (the whole header when they showed
    # none): a one-character prefix would match anywhere.
    shortest = shape.header_min or len(header)
    for k in range(len(header), shortest - 1, -1):
        if header.rfind("<", 0, k) > header.rfind(">", 0, k):
            # A prefix that ends inside a marker (the "<t" of "<think>") would match the start of another
            # one ("<tool_call>") and cut it: never a header's end.
            continue
        at = full.rfind(header[:k], low, body_start)
        if at >= 0:
            return at + k
    return None


def _prompt_end(
    render: Render, messages: list[ChatMessage], full: str, i: int, low: int, body_start: int
) -> int | None:
    """Return where the prompt for message i ends, when the template renders that prompt as a prefix.

    For turns whose header is not the generation prompt (DeepSeek answers after tool output have none).
    """
    try:
        prompt = render(messages[:i], True)
    except Exception:
        return None
    for candidate in (prompt, prompt.rstrip()):
        if low <= len(candidate) <= body_start and full.startswith(candidate):
            return len(candidate)
    return None


def _marker_end(full: str, body_end: int, limit: int, shape: TemplateShape) -> int | None:
    """Return the end of the first end-of-turn marker after the body, if one follows closely."""
    if not shape.end_markers:
        return body_end
    window = min(limit, body_end + shape.max_gap)
    ends = [at + len(m) for m in shape.end_markers if (at := full.find(m, body_end, window)) >= 0]
    if ends:
        return min(ends)
    if limit == len(full) and not any(full.find(m, body_end) >= 0 for m in shape.end_markers):
        return body_end  # the last answer of a template that closes answers with the next role (GLM)
    return None


def _not_found(i: int, why: str) -> RecordError:
    return RecordError(
        "template_spans_not_found",
        f"cannot locate assistant message {i} in the rendered conversation ({why}); "
        "use a chat template with {% generation %} blocks",
    )


def _common_suffix(a: str, b: str, limit: int) -> int:
    """Return the length of the longest common suffix, at most ``limit``."""
    low, high = 0, max(0, limit)
    if high == 0 or a[len(a) - high :] == b[len(b) - high :]:
        return high
    while low < high:
        mid = (low + high + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            low = mid
        else:
            high = mid - 1
    return low
