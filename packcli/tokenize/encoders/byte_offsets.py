"""Label masks by the offset rule: from a ``tokenizers`` encoding's character offsets (``span_mask``), or,
without offsets, from the byte lengths of byte-level BPE tokens (``byte_level_masks``).

In a byte-level BPE tokenizer without a normalizer, the tokens of a text, one after the other, are the
text's UTF-8 bytes: an ordinary token covers as many bytes as its vocabulary string has characters (one
character a byte), an added token the bytes of its content. So each token's byte span follows from the
ids alone, and its character span is that of the characters its first and last bytes belong to, which is
how ``tokenizers`` reports a byte-level token's offsets (a token holding part of a character has the
whole character's span). A token is trained when its span overlaps a trained span: the offset
rule. A text whose tokens do not add up to its bytes (an added token that strips the spaces
beside it, say) is left to the reference encoder.
"""

from __future__ import annotations

import bisect
import json
from typing import Any

import numpy as np

from packcli.tokenize.long.bounds import tokenizer_settings

# The characters GPT-2's byte-level alphabet stands for bytes with: printable Latin-1 as themselves, the
# other 68 bytes as U+0100 to U+0143.
_BYTE_CHARS = frozenset(
    [chr(c) for c in (*range(33, 127), *range(161, 173), *range(174, 256))] + [chr(256 + i) for i in range(68)]
)


def token_byte_lengths(backend_json: str) -> np.ndarray | None:
    """Return each id's byte length (int64), or None where the tokenizer (its ``tokenizer.json`` text) is
    not plain byte-level BPE.

    Plain: no normalizer (or an empty sequence), a ByteLevel pre-tokenizer that adds no prefix space, a
    BPE model whose vocabulary is all byte-level strings.
    """
    spec = tokenizer_settings(backend_json, ("normalizer", "pre_tokenizer", "added_tokens"))
    normalizer = spec.get("normalizer")
    if normalizer is not None and not (normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")):
        return None
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    byte_level = [s for s in steps if isinstance(s, dict) and s.get("type") == "ByteLevel"]
    if len(byte_level) != 1 or byte_level[0].get("add_prefix_space"):
        return None
    model = json.loads(backend_json).get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or not isinstance(model.get("vocab"), dict):
        return None
    vocab: dict[str, int] = model["vocab"]
    added = {int(t["id"]): str(t["content"]) for t in spec.get("added_tokens") or []}
    size = max([*vocab.values(), *added.keys()], default=-1) + 1
    lengths = np.zeros(size, dtype=np.int64)
    for token, i in vocab.items():
        if i in added:  # an added token the vocabulary also lists (DeepSeek's BOS and EOS): its content counts
            continue
        if not set(token) <= _BYTE_CHARS:
            return None
        lengths[i] = len(token)
    for i, content in added.items():
        lengths[i] = len(content.encode("utf-8"))
    return lengths


def byte_level_masks(
    ids: np.ndarray, starts: np.ndarray, items: list[tuple[str, list[tuple[int, int]]]], lengths: np.ndarray
) -> list[np.ndarray | None]:
    """Return each text's mask of the tokens whose character span overlaps its spans, the text's tokens
    being ``ids[starts[k]:starts[k + 1]]``; None for a text whose ids do not add up to its bytes (or hold
    an id out of the table, or one that covers no byte).

    In bytes: a token covers [start, end) of the text's UTF-8 bytes, and a span [a, b) of characters the
    bytes [A, B) of those characters. The token's characters (the one holding its first byte to the one
    holding its last) overlap the span exactly when start < B and end > A, so only the spans' ends are
    turned into bytes, not every character. The tokens' byte ends are summed over the whole batch at
    once; in a text whose tokens all cover a byte, starts and ends both rise, so the tokens a span
    trains are one run, found by two binary searches.
    """
    bounds = starts.tolist()
    nbytes = lengths.take(ids, mode="clip") if len(ids) and len(lengths) else np.zeros(len(ids), dtype=np.int64)
    if len(ids) and (int(ids.max()) >= len(lengths) or int(ids.min()) < 0):
        nbytes[(ids < 0) | (ids >= len(lengths))] = 0  # an id out of the table: its text fails below
    # Where each token ends, in the batch's bytes; a token starts where the one before it ends.
    ends = np.cumsum(nbytes, dtype=np.int64)
    byteless = np.flatnonzero(nbytes == 0).tolist()  # tokens of no byte: their texts fail below
    out: list[np.ndarray | None] = []
    for k, (text, spans) in enumerate(items):
        first, stop = bounds[k], bounds[k + 1]
        if first == stop:
            out.append(np.zeros(0, dtype=bool) if not text else None)
            continue
        base = int(ends[first - 1]) if first else 0
        ascii_text = text.isascii()
        try:
            total = len(text) if ascii_text else len(text.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: the reference decides what happens to it
            out.append(None)
            continue
        if int(ends[stop - 1]) - base != total or (byteless and _any_within(byteless, first, stop)):
            out.append(None)
            continue
        mask = np.zeros(stop - first, dtype=bool)
        live = [(a, b) for a, b in spans if b > a]
        if live:
            at = _byte_offsets(text, [x for a, b in live for x in (a, b)], ascii_text)
            mine = ends[first:stop]
            # The first token ending after A; the tokens starting before B: the first, and each after a
            # token that ends before B.
            lo = np.searchsorted(mine, [base + at[a] for a, _ in live], "right").tolist()
            hi = np.searchsorted(mine[:-1], [base + at[b] for _, b in live], "left").tolist()
            for x, y, (_, b) in zip(lo, hi, live, strict=True):
                if at[b] > 0:
                    mask[x : y + 1] = True
        out.append(mask)
    return out


def _any_within(sorted_positions: list[int], first: int, stop: int) -> bool:
    """Whether one of ``sorted_positions`` lies in [first, stop)."""
    at = bisect.bisect_left(sorted_positions, first)
    return at < len(sorted_positions) and sorted_positions[at] < stop


def _byte_offsets(text: str, chars: list[int], ascii_text: bool) -> dict[int, int]:
    """Return the UTF-8 byte offset of each character offset in ``chars`` (clipped to the text)."""
    if ascii_text:
        return {c: min(max(c, 0), len(text)) for c in chars}
    out: dict[int, int] = {}
    last_char = last_byte = 0
    for c in sorted(set(chars)):
        at = min(max(c, 0), len(text))
        last_byte += len(text[last_char:at].encode("utf-8"))
        last_char = at
        out[c] = last_byte
    return out


def ids_and_mask(enc: Any, spans: list[tuple[int, int]], n_chars: int) -> tuple[np.ndarray, np.ndarray]:
    """Return an encoding's ids (int32) and the mask of its tokens that overlap ``spans``."""
    ids = np.asarray(enc.ids, dtype=np.int32)
    return ids, span_mask(enc, spans, len(ids), n_chars)


def span_mask(enc: Any, spans: list[tuple[int, int]], n_tokens: int, n_chars: int) -> np.ndarray:
    """Mark every token whose character span overlaps one of ``spans`` (the rule transformers uses).

    Offsets are monotone, so the tokens overlapping [a, b) run from the first token containing
    character a to the last token starting before b; two lookups a span instead of every offset.
    """
    mask = np.zeros(n_tokens, dtype=bool)
    for a, b in spans:
        if b <= a or n_tokens == 0:
            continue
        first = enc.char_to_token(a)
        last = n_tokens - 1 if b >= n_chars else enc.char_to_token(b)
        if first is None or last is None:
            return _span_mask_offsets(enc, spans, n_tokens)
        if b < n_chars and enc.token_to_chars(last)[0] >= b:
            last -= 1
        # A character split over several byte tokens: include all tokens that start before b.
        while last + 1 < n_tokens and enc.token_to_chars(last + 1)[0] < b:
            last += 1
        if last >= first:
            mask[first : last + 1] = True
    return mask


def _span_mask_offsets(enc: Any, spans: list[tuple[int, int]], n_tokens: int) -> np.ndarray:
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(n_tokens, 2)
    mask = np.zeros(n_tokens, dtype=bool)
    for a, b in spans:
        mask |= (offsets[:, 0] < b) & (offsets[:, 1] > a)
    return mask
