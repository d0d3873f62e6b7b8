"""A text certainly too long for a row, encoded by windows in bounded memory, with the tokens of the whole.

Encoding a 20 MB text at once (with the character offsets the label masks need) takes about 3 GB of the
tokenizer's working memory. Under ``--overflow truncate`` or ``split``, a text of more UTF-8 bytes than a
row's tokens can cover (``Encoder.long_text_bytes``, from ``packcli.tokenize.long.bounds``) is encoded
WINDOW_CHARS characters at a time (about 45 MB) and the windows are joined where they agree; when they
cannot be joined with certainty the text is encoded whole, as any other.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from packcli.tokenize.long.bounds import utf8_length

# Consecutive windows overlap by 2 * OVERLAP_CHARS characters and are joined where they agree.
WINDOW_CHARS = 1 << 18
OVERLAP_CHARS = 1 << 12

# The tokens (and their offsets) that ``add_special_tokens`` puts before and after a text.
Affixes = tuple[tuple[list[int], list[Any]], tuple[list[int], list[Any]]]
NO_AFFIXES: Affixes = (([], []), ([], []))


@dataclass(frozen=True)
class Joined:
    """The encoding of a long text joined from windows: what label masks read of a tokenizers Encoding."""

    ids: np.ndarray  # int64
    offsets: np.ndarray  # int64 (n, 2): each token's character span in the text

    def char_to_token(self, pos: int) -> int | None:
        """The first token whose span holds character ``pos`` (as ``Encoding.char_to_token``)."""
        starts, ends = self.offsets[:, 0], self.offsets[:, 1]
        if self._monotone:
            t = int(np.searchsorted(ends, pos, side="right"))
            return t if t < len(ends) and starts[t] <= pos else None
        hits = np.flatnonzero((starts <= pos) & (pos < ends))
        return int(hits[0]) if len(hits) else None

    def token_to_chars(self, token: int) -> tuple[int, int]:
        start, end = self.offsets[token]
        return int(start), int(end)

    @functools.cached_property
    def _monotone(self) -> bool:
        return bool(np.all(np.diff(self.offsets[:, 0]) >= 0) and np.all(np.diff(self.offsets[:, 1]) >= 0))


def certainly_long(text: str, limit: int | None) -> bool:
    """Return whether ``text`` has more than ``limit`` UTF-8 bytes and is long enough for two windows.

    None: no limit, every text is encoded whole.
    """
    return limit is not None and len(text) > 2 * WINDOW_CHARS and utf8_length(text) > limit


def encode_long(backend: Any, text: str, affixes: Affixes) -> Joined | None:
    """Return the encoding of ``text`` made by windows, with ``affixes`` around it (None: encode it whole).

    ``affixes`` are the special tokens the encoding adds (``special_affixes``, or NO_AFFIXES).
    """
    joined = encode_windows(backend, text)
    if joined is None:
        return None
    (head, head_offsets), (tail, tail_offsets) = affixes
    if head or tail:
        joined = Joined(
            np.concatenate([np.asarray(head, np.int64), joined.ids, np.asarray(tail, np.int64)]),
            np.concatenate([np.asarray(head_offsets, np.int64).reshape(-1, 2), joined.offsets,
                            np.asarray(tail_offsets, np.int64).reshape(-1, 2)]),
        )  # fmt: skip
    return joined


def special_affixes(backend: Any) -> Affixes | None:
    """The tokens (and offsets) ``add_special_tokens`` puts before and after a text, or None if it does more."""
    probe = "a b"
    bare = backend.encode(probe, add_special_tokens=False)
    full = backend.encode(probe, add_special_tokens=True)
    n = len(bare.ids)
    for k in range(len(full.ids) - n + 1):
        if full.ids[k : k + n] == bare.ids and full.offsets[k : k + n] == bare.offsets:
            extra = full.offsets[:k] + full.offsets[k + n :]
            if any(tuple(o) != (0, 0) for o in extra):
                return None
            return (full.ids[:k], full.offsets[:k]), (full.ids[k + n :], full.offsets[k + n :])
    return None


def _window(backend: Any, text: str, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    enc = backend.encode(text[start:end], add_special_tokens=False)
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2) + start
    return np.asarray(enc.ids, dtype=np.int64), offsets


def encode_windows(backend: Any, text: str) -> Joined | None:
    """Encode ``text`` (without special tokens added) by windows of WINDOW_CHARS characters, joined.

    Two consecutive windows overlap by 2 * OVERLAP_CHARS characters and are cut at one place in the
    middle of the overlap, where a word ends before a space (a piece boundary of every byte-level
    pre-tokenizer's split rule, which attaches a space to the word after it), and only when both windows
    give the same tokens (ids and spans) over the OVERLAP_CHARS characters around it: each side of the
    cut is then encoded with at least OVERLAP_CHARS / 2 characters of context beyond it. The first window
    supplies the tokens before the cut, the second those after. Where no such place exists (a run of
    text without a space, windows that disagree), None: the caller encodes the text whole.
    """
    n = len(text)
    ids_parts: list[np.ndarray] = []
    offset_parts: list[np.ndarray] = []
    start, end = 0, min(n, WINDOW_CHARS)
    ids, offsets = _window(backend, text, start, end)
    first = 0  # the tokens of the current window before this one were taken from the window before it
    while end < n:
        nxt = end - 2 * OVERLAP_CHARS
        nxt_end = min(n, nxt + WINDOW_CHARS)
        nxt_ids, nxt_offsets = _window(backend, text, nxt, nxt_end)
        lo, hi = nxt + OVERLAP_CHARS // 2, end - OVERLAP_CHARS // 2
        here = (offsets[:, 0] >= lo) & (offsets[:, 0] < hi)
        there = (nxt_offsets[:, 0] >= lo) & (nxt_offsets[:, 0] < hi)
        if not (np.array_equal(ids[here], nxt_ids[there]) and np.array_equal(offsets[here], nxt_offsets[there])):
            return None
        cut = _cut_point(text, offsets[here], end - OVERLAP_CHARS, OVERLAP_CHARS // 4)
        if cut is None:
            return None
        a = int(np.flatnonzero(offsets[:, 0] == cut)[0])
        b = int(np.flatnonzero(nxt_offsets[:, 0] == cut)[0])
        ids_parts.append(ids[first:a])
        offset_parts.append(offsets[first:a])
        ids, offsets, first, end = nxt_ids, nxt_offsets, b, nxt_end
    ids_parts.append(ids[first:])
    offset_parts.append(offsets[first:])
    return Joined(np.concatenate(ids_parts), np.concatenate(offset_parts))


def _cut_point(text: str, offsets: np.ndarray, middle: int, reach: int) -> int | None:
    """The token start nearest ``middle`` (within ``reach``) where a word ends before a space, or None.

    The token before it must end there too (not one of several tokens of one character).
    """
    starts = offsets[:, 0]
    clean = np.flatnonzero(starts[1:] == offsets[:-1, 1]) + 1  # a token that starts where the one before ends
    clean = clean[np.abs(starts[clean] - middle) <= reach]
    for k in clean[np.argsort(np.abs(starts[clean] - middle), kind="stable")]:
        c = int(starts[k])
        if text[c] == " " and not text[c - 1].isspace() and (k + 1 >= len(starts) or starts[k + 1] > c):
            return c
    return None
