"""What a chat template puts around assistant answers, learned once per template from probe conversations.

Templates without ``{% generation %}`` blocks do not say where an answer starts and ends; the answers are
located in a rendering (``packcli.tokenize.templates.spans``) by the template's *shape*: its assistant header (the
generation prompt, or the part of it that history turns show) and the markers that end an answer
(``<|im_end|>``, ``<|eot_id|>``, ``<|return|>``, a tool call's ``<|call|>``...). The shape is learned by
rendering conversations of probe words (plain ASCII that no template trims, splits or escapes) and
comparing the renderings; a template whose shape cannot be learned is reported, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packcli.jsontypes import ChatMessage

# Probe texts: plain ASCII words that no template trims, splits or escapes.
_PROBE = {
    "u1": "qzxuserprobeonezq",
    "a1": "qzxassistantprobeonezq",
    "u2": "qzxuserprobetwozq",
    "a2": "qzxassistantprobetwozq",
    "arg": "qzxargumentprobezq",
    "tool": "qzxtoolprobezq",
    "r1": "qzxreasoningprobeonezq",
    "r2": "qzxreasoningprobetwozq",
}
_PROBE_TOOL = "qzxprobetoolzq"
_PROBE_NUMBER = 7345291

# Renders messages with the template: ``render(messages, add_generation_prompt)``.
Render = Callable[[list[ChatMessage], bool], str]
# Returns the (start, end) character spans of the special tokens (and marker-looking text) in a string.
MarkerSpans = Callable[[str], list[tuple[int, int]]]
# Builds a probe message from a role and its text (as a string, or as text parts for templates that need them).
MakeMessage = Callable[[str, str], ChatMessage]


@dataclass(frozen=True)
class TemplateShape:
    """What a template puts around assistant answers, learned from probe conversations."""

    header: str  # the text before an answer: the generation prompt (or the user closing + it)
    header_min: int  # the shortest prefix of ``header`` that history turns are sure to show
    end_markers: tuple[str, ...]  # what ends an answer: ``<|im_end|>``, ``<|eot_id|>``, ``<|return|>``...
    max_gap: int  # the most template text seen between an answer and its marker, with slack
    generation_prompt: str


def learn_shape(render: Render, marker_spans: MarkerSpans, message: MakeMessage | None = None) -> TemplateShape:
    """Return the template's assistant header and end-of-turn markers, from probe renderings.

    ``render(messages, add_generation_prompt)`` renders with the template; ``message(role, text)`` builds
    a probe message; ``marker_spans(text)`` gives where the special tokens are in a text, so that a
    common prefix never ends inside a marker and a closing such as ``"}\\n</tool_call><|im_end|>"`` is
    cut down to its markers. Raises ValueError when the template cannot render a plain user/assistant
    conversation.
    """
    message = message or _msg
    u1, a1, u2, a2 = (_PROBE[k] for k in ("u1", "a1", "u2", "a2"))
    probe = [message("user", u1), message("assistant", a1), message("user", u2), message("assistant", a2)]
    full = render(probe, False)
    with_prompt = render(probe[:1], True)
    without = render(probe[:1], False)
    positions = [full.find(t) for t in (u1, a1, u2, a2)]
    if min(positions) < 0 or positions != sorted(positions) or with_prompt.find(u1) < 0:
        raise ValueError("the template does not render the text of a plain user/assistant conversation")
    end = [p + len(t) for p, t in zip(positions, (u1, a1, u2, a2), strict=True)]
    user_to_answer = full[end[0] : positions[1]]
    answer_to_user = full[end[1] : positions[2]]
    after_last = full[end[3] :]
    generation_prompt = with_prompt[_cut(with_prompt, common_prefix(with_prompt, without), marker_spans) :]
    header = generation_prompt if generation_prompt.strip() else with_prompt[with_prompt.find(u1) + len(u1) :]
    header_min = _longest_header_prefix(header, user_to_answer)
    # An answer with reasoning may show less of the header than one without (Qwen3.8 and Nemotron with
    # thinking off: the prompt adds an empty think block, an answer with reasoning opens its own).
    reasoning_min = _reasoning_header_min(render, message, header)
    if reasoning_min:
        header_min = min(header_min or len(header), reasoning_min)

    markers: list[str] = []
    shared = answer_to_user[: _cut(answer_to_user, common_prefix(answer_to_user, after_last), marker_spans)].rstrip()
    rest = after_last[len(shared) :]
    if shared and (not rest or rest[0].isspace() or not rest.strip()):
        markers.append(shared)  # history and the last answer end alike: <|im_end|>, <|eot_id|>, </s>
    else:
        if after_last.strip():
            markers.append(after_last.strip())  # the last answer's own marker: <|return|>
        cut = user_to_answer.find(header[: max(header_min, 1)]) if header.strip() else -1
        closing = user_to_answer[:cut].strip() if cut > 0 else ""
        if closing and answer_to_user.startswith(closing):
            markers.append(closing)  # history answers close like user turns: <|end|>
        elif not markers:
            # No closing at all (GLM): the next role's marker is what the model emits to stop.
            found = marker_spans(answer_to_user)
            first = min(found) if found else None
            if first is not None and not answer_to_user[: first[0]].strip():
                markers.append(answer_to_user[first[0] : first[1]])
    gaps = [len(answer_to_user), len(after_last)]
    for tool_marker, gap in _tool_call_markers(render, marker_spans, message):
        markers.append(tool_marker)
        gaps.append(gap)
    markers = [_from_first_marker(m, marker_spans) or m for m in markers]
    return TemplateShape(
        header=header,
        header_min=header_min,
        end_markers=tuple(dict.fromkeys(m for m in markers if m)),
        max_gap=2 * max(gaps) + 64,
        generation_prompt=generation_prompt,
    )


def _longest_header_prefix(header: str, text: str) -> int:
    """Return the length of the longest prefix of ``header`` found in ``text`` (0 when none is)."""
    return next((k for k in range(len(header), 0, -1) if header[:k] in text), 0)


def _reasoning_header_min(render: Render, message: MakeMessage, header: str) -> int:
    """Return how much of ``header`` the template shows before an answer's reasoning (0: no reasoning shown).

    The shortest over an answer in history and the last answer, each given a ``reasoning_content``.
    """
    u1, a1, u2, a2, r1, r2 = (_PROBE[k] for k in ("u1", "a1", "u2", "a2", "r1", "r2"))
    probe = [
        message("user", u1),
        {**message("assistant", a1), "reasoning_content": r1},
        message("user", u2),
        {**message("assistant", a2), "reasoning_content": r2},
    ]
    try:
        full = render(probe, False)
    except Exception:  # a template may refuse the field: then it shows no reasoning
        return 0
    found = []
    for user, reasoning in ((u1, r1), (u2, r2)):
        after, at = full.find(user), full.find(reasoning)
        if after < 0 or at < after:
            continue  # the template drops this reasoning (Qwen3 drops it from history)
        k = _longest_header_prefix(header, full[after + len(user) : at])
        if k:
            found.append(k)
    return min(found, default=0)


def _tool_call_markers(render: Render, marker_spans: MarkerSpans, message: MakeMessage) -> list[tuple[str, int]]:
    """Return what ends an answer that calls a tool (``<|call|>`` in gpt-oss), when the template has tools.

    Learned from calls whose arguments end in text, in a number, and that have no arguments: what
    closes the call can differ (Gemma 4 closes a string with a quote marker before the call's own).
    """
    found = []
    probes = ((_PROBE["arg"], _PROBE["arg"]), (_PROBE_NUMBER, str(_PROBE_NUMBER)), (None, _PROBE_TOOL))
    for n, (arguments, anchor) in enumerate(probes):
        marker = _tool_call_marker(render, marker_spans, message, arguments, anchor)
        if marker and n:
            # Anchored on a number or the tool's name, what follows can hold template text: only the
            # markers that end it are kept (``<tool_call|><|tool_response>``, ``</tool_call>``).
            marker = (_trailing_markers(marker[0], marker_spans), marker[1])
        if marker and marker[0] and marker not in found:
            found.append(marker)
    return found


def _tool_call_marker(
    render: Render, marker_spans: MarkerSpans, message: MakeMessage, argument: Any, anchor: str
) -> tuple[str, int] | None:
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": _PROBE_TOOL, "arguments": {} if argument is None else {"query": argument}},
            }
        ],
    }
    probe = [message("user", _PROBE["u1"]), call, message("tool", _PROBE["tool"])]
    try:
        full = render(probe, False)
        last = render(probe[:2], False)
    except Exception:  # a template without tool support may raise anything
        return None
    at, tool_at, last_at = full.find(anchor), full.find(_PROBE["tool"]), last.find(anchor)
    if at < 0 or tool_at < at or last_at < 0:
        return None
    after = full[at + len(anchor) : tool_at]
    after_last = last[last_at + len(anchor) :]
    shared = after[: _cut(after, common_prefix(after, after_last), marker_spans)].rstrip()
    marker = _from_first_marker(shared, marker_spans)
    return (marker, len(after)) if marker else None


def _cut(text: str, n: int, marker_spans: MarkerSpans) -> int:
    """Return ``n``, moved back to the start of the marker it falls inside (if any)."""
    for start, end in marker_spans(text):
        if start < n < end:
            return start
    return n


def _from_first_marker(text: str, marker_spans: MarkerSpans) -> str:
    """Return ``text`` from its first marker on ('' when it holds none)."""
    found = marker_spans(text)
    return text[min(s for s, _ in found) :] if found else ""


def _trailing_markers(text: str, marker_spans: MarkerSpans) -> str:
    """Return the markers that end ``text`` with only whitespace between them ('' when it ends otherwise)."""
    start = len(text)
    for a, b in sorted(marker_spans(text), reverse=True):
        if text[b:start].strip():
            break
        start = a
    return text[start:]


def _msg(role: str, content: str) -> ChatMessage:
    return {"role": role, "content": content}


def common_prefix(a: str, b: str) -> int:
    """Return the length of the longest common prefix (binary search over C-level comparisons).

    Renderings are compared this way here and where answers are located (``packcli.tokenize.templates.spans``).
    """
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # invariant: a[:low] == b[:low] and a[:high] != b[:high]
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low
