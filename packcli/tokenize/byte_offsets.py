"""Character offsets of byte-level BPE tokens from their byte lengths, for label masks without offsets.

In a byte-level BPE tokenizer without a normalizer, the tokens of a text, one after the other, are the
text's UTF-8 bytes: an ordinary token covers as many bytes as its vocabulary string has characters (one
character a byte), an added token the bytes of its content. So each token's byte span follows from the
ids alone, and its character span is that of the characters its first and last bytes belong to, which is
how ``tokenizers`` reports a byte-level token's offsets (a token holding part of a character has the
whole character's span). A token is trained when its span overlaps a trained span: the rule of
``span_mask``. A text whose tokens do not add up to its bytes (an added token that strips the spaces
beside it, say) is left to the reference encoder.
"""

from __future__ import annotations

import json

import numpy as np

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
    spec = json.loads(backend_json)
    normalizer = spec.get("normalizer")
    if normalizer is not None and not (normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")):
        return None
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    byte_level = [s for s in steps if isinstance(s, dict) and s.get("type") == "ByteLevel"]
    if len(byte_level) != 1 or byte_level[0].get("add_prefix_space"):
        return None
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or not isinstance(model.get("vocab"), dict):
        return None
    vocab: dict[str, int] = model["vocab"]
    added = {int(t["id"]): str(t["content"]) for t in spec.get("added_tokens", [])}
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


def byte_level_mask(ids: np.ndarray, text: str, spans: list[tuple[int, int]], lengths: np.ndarray) -> np.ndarray | None:
    """Return the mask of the tokens whose character span overlaps ``spans``; None where the ids do not
    add up to the text's bytes (or an id is out of the table, or covers no byte)."""
    if len(ids) == 0:
        return np.zeros(0, dtype=bool) if not text else None
    if int(ids.max()) >= len(lengths) or int(ids.min()) < 0:
        return None
    nbytes = lengths[ids]
    try:
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    except UnicodeEncodeError:  # a lone surrogate: the reference decides what happens to it
        return None
    char_bytes = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    char_ends = np.cumsum(char_bytes)
    token_ends = np.cumsum(nbytes)
    if token_ends[-1] != char_ends[-1] or not np.all(nbytes > 0):
        return None
    first_char = np.searchsorted(char_ends, token_ends - nbytes, side="right")
    end_char = np.searchsorted(char_ends, token_ends - 1, side="right") + 1
    mask = np.zeros(len(ids), dtype=bool)
    for a, b in spans:
        if b > a:
            mask |= (first_char < b) & (end_char > a)
    return mask
