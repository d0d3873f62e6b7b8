"""``--overflow split``: a record too long for one row becomes several samples, each whole and exact.

A conversation is cut at turn boundaries: a piece is a run of whole exchanges (an exchange starts at
a user message that follows an assistant message, and runs to the next such user message), with the
leading system message(s) repeated at its head (``--split-system all``) or kept in the first piece only
(``first``). A piece's tokens are those of the chat template applied to its own messages, and its
labels follow the rule of the whole record: a turn is trained in a piece exactly when ``--train-on``
trains it in the whole conversation. Pieces are as long as fit: greedy by exchanges, checked by
encoding, forward from the first exchange; backward from the last when only the last turns are
trained (``last_assistant``, ``completion``), so that the trained piece keeps the most context. Pieces
without a trained turn are left out (counted, with their tokens). An exchange that does not fit on its own
is kept whole as its own piece, and the plan truncates it as ``--overflow truncate`` would (``--truncate-side``).

Text, prompt/completion strings and tokenized records are cut into consecutive chunks of at most
``--max-len`` tokens of the record's own encoding: they concatenate back to it (BOS only where the
tokenizer put it, EOS only at the end). Each chunk's first label is -100, as every sample's is. A last
chunk shorter than ``--min-piece`` is left out (counted, with its tokens), as is a chunk with nothing to train.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from packcli.contract import IGNORE_INDEX
from packcli.errors import RecordError
from packcli.jsontypes import ChatMessage
from packcli.records.formats import Sample
from packcli.tokenize.options import SplitRule
from packcli.tokenize.templates.chat_template import resolve_train_on, trained_turns

Encoded = tuple[np.ndarray, np.ndarray]


@dataclass
class Pieces:
    """The pieces of one record, and why others were left out (reason -> count, reason -> their tokens)."""

    pieces: list[Encoded]
    left_out: Counter[str]
    left_out_tokens: Counter[str] = field(default_factory=Counter)


def exchanges(messages: list[ChatMessage]) -> tuple[int, list[tuple[int, int]]]:
    """Return the number of leading system messages and the [start, end) message ranges of the exchanges."""
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    cuts = [head] + [
        i
        for i in range(head + 1, len(messages))
        if messages[i].get("role") == "user" and messages[i - 1].get("role") == "assistant"
    ]
    bounds = [*cuts, len(messages)]
    return head, [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def split_chat(
    sample: Sample,
    train_on: str,
    rule: SplitRule,
    encode: Callable[[Sample], Encoded | RecordError],
    whole_tokens: int | None = None,
    count: Callable[[Sample], int | None] | None = None,
) -> Pieces:
    """Cut a conversation into pieces of whole exchanges that fit in ``rule.max_len`` tokens.

    ``whole_tokens`` (the record's own token count; encoded here when not given) only guides where
    the search starts. ``count`` gives a piece's token count without its labels (a piece left out
    for having no trained turn cannot be encoded with them); without it, those tokens are not counted.
    """
    search = _PieceSearch(sample, train_on, rule, encode, whole_tokens)
    backward = search.resolved in ("last_assistant", "completion")
    ranges = _ranges_backward(search) if backward else _ranges_forward(search)
    return _kept_pieces(search, ranges, count)


class _PieceSearch:
    """A conversation's candidate pieces (runs of exchanges ``[a, b)``): their samples, sizes and encodings."""

    def __init__(
        self,
        sample: Sample,
        train_on: str,
        rule: SplitRule,
        encode: Callable[[Sample], Encoded | RecordError],
        whole_tokens: int | None,
    ) -> None:
        self.sample, self.rule, self.encode = sample, rule, encode
        self.messages = messages = sample.messages or []
        self.head, self.spans = head, spans = exchanges(messages)
        self.resolved = resolve_train_on(sample, train_on)
        self.trained = set(trained_turns(sample, train_on)) if self.resolved != "all" else None
        self.cache: dict[tuple[int, int], Encoded | RecordError] = {}
        # Where to start looking: each exchange's share of tokens by its characters, at the tokens per
        # character of the whole record, then of the last piece encoded (pieces of one conversation are
        # alike). Real encodes then move the cut to where it fits (usually two: the piece, one exchange more).
        chars = [sum(len(json.dumps(m, ensure_ascii=False, default=str)) for m in messages[lo:hi]) for lo, hi in spans]
        self.head_chars = sum(len(json.dumps(m, ensure_ascii=False, default=str)) for m in messages[:head])
        self.prefix = [0, *itertools.accumulate(chars)]
        if whole_tokens is None:
            whole = encode(sample)
            whole_tokens = rule.max_len + 1 if isinstance(whole, RecordError) else len(whole[0])
        self.per_char = whole_tokens / max(1, self.head_chars + self.prefix[-1])

    def piece(self, a: int, b: int) -> Sample:
        """Return the sample of exchanges [a, b): the system head where kept, the trained turns renumbered."""
        keep_head = self.rule.system == "all" or a == 0
        lo, hi = self.spans[a][0], self.spans[b - 1][1]
        picked = (list(range(self.head)) if keep_head else []) + list(range(lo, hi))
        trained, marks_in = self.trained, self.sample.message_train
        turns = None if trained is None else tuple(k for k, i in enumerate(picked) if i in trained)
        marks = None if marks_in is None else tuple(marks_in[i] for i in picked)
        return replace(
            self.sample,
            messages=[self.messages[i] for i in picked],
            prompt_len=None,
            trained_turns=turns,
            message_train=marks,
        )

    def has_training(self, a: int, b: int) -> bool:
        """Return whether exchanges [a, b) hold a trained turn."""
        if self.trained is None:
            return True
        lo, hi = self.spans[a][0], self.spans[b - 1][1]
        return any(lo <= i < hi for i in self.trained)

    def chars_of(self, a: int, b: int) -> int:
        """Return the characters of the piece of exchanges [a, b), its system head included where kept."""
        with_head = self.rule.system == "all" or a == 0
        return (self.head_chars if with_head else 0) + self.prefix[b] - self.prefix[a]

    def estimate(self, a: int, b: int) -> float:
        """Return the guessed tokens of the piece of exchanges [a, b), from its characters."""
        return self.per_char * self.chars_of(a, b)

    def length(self, a: int, b: int) -> int:
        """Tokens of the piece of exchanges [a, b); a piece the template cannot render counts as too long."""
        if (a, b) not in self.cache:
            self.cache[(a, b)] = got = self.encode(self.piece(a, b))
            if not isinstance(got, RecordError):
                self.per_char = len(got[0]) / max(1, self.chars_of(a, b))
        got = self.cache[(a, b)]
        return self.rule.max_len + 1 if isinstance(got, RecordError) else len(got[0])

    def fits(self, a: int, b: int) -> bool:
        """Return whether the piece of exchanges [a, b) fits in ``max_len`` tokens."""
        return self.length(a, b) <= self.rule.max_len


def _ranges_forward(search: _PieceSearch) -> list[tuple[int, int]]:
    """Return the pieces' exchange ranges, each as long as fits, greedy from the first exchange."""
    max_len, n = search.rule.max_len, len(search.spans)
    ranges: list[tuple[int, int]] = []
    a = 0
    while a < n:
        b = a + 1
        while b < n and search.estimate(a, b + 1) <= max_len:
            b += 1
        while b > a + 1 and not search.fits(a, b):
            b -= 1
        while b < n and search.fits(a, b + 1):
            b += 1
        ranges.append((a, b))
        a = b
    return ranges


def _ranges_backward(search: _PieceSearch) -> list[tuple[int, int]]:
    """Return the pieces' exchange ranges, each as long as fits, greedy from the last exchange (in order)."""
    max_len = search.rule.max_len
    ranges: list[tuple[int, int]] = []
    b = len(search.spans)
    while b > 0:
        a = b - 1
        while a > 0 and search.estimate(a - 1, b) <= max_len:
            a -= 1
        while a < b - 1 and not search.fits(a, b):
            a += 1
        while a > 0 and search.fits(a - 1, b):
            a -= 1
        ranges.append((a, b))
        b = a
    ranges.reverse()
    return ranges


def _kept_pieces(
    search: _PieceSearch, ranges: list[tuple[int, int]], count: Callable[[Sample], int | None] | None
) -> Pieces:
    """Return the encoded pieces of ``ranges`` that train something; count the others, by reason."""
    out: list[Encoded] = []
    left_out: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for a, b in ranges:
        if not search.has_training(a, b):
            left_out["untrained_piece"] += 1
            tokens["untrained_piece"] += (count(search.piece(a, b)) if count is not None else None) or 0
            continue
        search.length(a, b)  # encoded once, by the search or here
        got = search.cache[(a, b)]
        if isinstance(got, RecordError):
            left_out[f"piece_{got.reason}"] += 1  # a piece the template cannot render has no tokens to count
            continue
        out.append(got)
    return Pieces(out, left_out, tokens)


def chunk_tokens(ids: np.ndarray, labels: np.ndarray, rule: SplitRule) -> Pieces:
    """Cut one encoded record into consecutive chunks of at most ``rule.max_len`` tokens."""
    out: list[Encoded] = []
    left_out: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for start in range(0, len(ids), rule.max_len):
        chunk_ids = ids[start : start + rule.max_len]
        chunk_labels = labels[start : start + rule.max_len].copy()
        chunk_labels[0] = IGNORE_INDEX
        reason = None
        if start and len(chunk_ids) < rule.min_piece:
            reason = "piece_too_short"
        elif not np.any(chunk_labels != IGNORE_INDEX):
            reason = "untrained_piece"
        if reason is None:
            out.append((chunk_ids, chunk_labels))
        else:
            left_out[reason] += 1
            tokens[reason] += len(chunk_ids)
    return Pieces(out, left_out, tokens)
