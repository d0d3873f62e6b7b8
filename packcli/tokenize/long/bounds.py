"""Rule out a record that cannot fit in --max-len tokens before tokenizing it.

Tokenizing a 50 MB record (with the character offsets the label masks need) takes tens of seconds and
gigabytes, only for it to be dropped as too long. The rule here is a sound lower bound on the token
count, computed without tokenizing:

    tokens >= utf8_bytes(text) / L

where L is the most bytes of text any one token can stand for. It holds when every byte of the text is
covered by exactly one token, which a byte-level BPE tokenizer guarantees when nothing drops or merges
text before the model: no normalizer, pre-tokenizers that only split (never remove), no unknown token
(every byte has a token) and no added token that absorbs the whitespace around it. L is then the
longest vocabulary entry (one character per byte under byte-level encoding) or the longest added
token's text, whichever is longer. For any other tokenizer there is no such bound and nothing is ruled
out early. A record is ruled out only if ``bytes > max_len * L``: it then needs more than max_len
tokens, so a record that would fit is never dropped.

Counting the bytes needs no memory beyond the decoded record: ASCII strings are measured by length and
others are encoded 1 MiB of characters at a time.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

from packcli.errors import Opt, RecordError
from packcli.jsontypes import JSONObject
from packcli.records.formats import Sample

CHUNK_CHARS = 1 << 20
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# Pre-tokenizers that split text into pieces and keep every character.
SPLITTING = {"ByteLevel", "Split", "Digits", "Punctuation", "UnicodeScripts"}


def _byte_alphabet() -> set[str]:
    """The 256 characters a byte-level tokenizer writes bytes as (printable bytes as themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {chr(b) for b in printable}
    shifted = [b for b in range(256) if b not in set(printable)]
    chars.update(chr(256 + k) for k in range(len(shifted)))
    return chars


def _pre_tokenizers(spec: JSONObject | None) -> list[JSONObject]:
    if spec is None:
        return []
    if spec.get("type") == "Sequence":
        return [p for item in spec.get("pretokenizers", []) for p in _pre_tokenizers(item)]
    return [spec]


def tokenizer_settings(tokenizer_json: str, wanted: tuple[str, ...]) -> JSONObject:
    """The members ``wanted`` of a tokenizer's JSON object, decoded without its ``model`` where they come
    before it.

    The model (the vocabulary and, for BPE, the merges) is nearly all of the text: decoding Gemma 3's
    takes 0.4 s and 165 MB, only for its normalizer to rule out what the callers look for. ``tokenizers``
    writes the model last; a JSON that puts one of ``wanted`` after it is decoded whole, and so is one whose
    text after the model names one of them at all (a member named twice: ``tokenizers`` takes the last, as
    ``json`` does; or a vocabulary entry of that name, which costs the whole decode and changes nothing).
    Only a name written with escapes would pass unseen, which no writer of ``tokenizer.json`` does.
    """
    decoder = json.JSONDecoder()
    found: JSONObject = {}
    at = _space(tokenizer_json, 0)
    if tokenizer_json[at : at + 1] != "{":
        return _members(json.loads(tokenizer_json), wanted)
    at += 1
    while not set(wanted) <= found.keys():
        at = _space(tokenizer_json, at)
        if tokenizer_json[at : at + 1] != '"':
            break  # the object's end (or a text json refuses: decoded whole below, raising)
        key, at = decoder.raw_decode(tokenizer_json, at)
        at = _space(tokenizer_json, at)
        if key == "model" or tokenizer_json[at : at + 1] != ":":
            break
        found[key], at = decoder.raw_decode(tokenizer_json, _space(tokenizer_json, at + 1))
        at = _space(tokenizer_json, at)
        if tokenizer_json[at : at + 1] == ",":
            at += 1
    if set(wanted) <= found.keys() and _named(wanted).search(tokenizer_json, at) is None:
        return _members(found, wanted)
    return _members(json.loads(tokenizer_json), wanted)


@functools.lru_cache(maxsize=8)
def _named(wanted: tuple[str, ...]) -> re.Pattern[str]:
    """Any of the names ``wanted``, as a JSON string."""
    return re.compile("|".join(re.escape(json.dumps(name)) for name in wanted))


def _space(text: str, at: int) -> int:
    return _WHITESPACE.match(text, at).end()  # type: ignore[union-attr]  # it matches the empty string


def _members(spec: Any, wanted: tuple[str, ...]) -> JSONObject:
    if not isinstance(spec, dict):
        raise ValueError("a tokenizer's JSON is an object")
    return {key: spec.get(key) for key in wanted}


# What decides whether a tokenizer bounds the bytes of a token, before its vocabulary is read.
_BOUND_SETTINGS = ("normalizer", "truncation", "pre_tokenizer", "added_tokens")


def max_token_bytes(tokenizer_json: str) -> int | None:
    """Return L, the most text bytes one token can cover, or None when the tokenizer gives no bound."""
    spec = tokenizer_settings(tokenizer_json, _BOUND_SETTINGS)
    if not _bounded(spec):
        return None
    model = json.loads(tokenizer_json).get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not _byte_alphabet() <= set(vocab):
        return None
    longest = max(len(token) for token in vocab)
    return max([longest, *(len(a["content"].encode("utf-8")) for a in spec.get("added_tokens") or [])])


def _bounded(spec: JSONObject) -> bool:
    """Whether the settings ``spec`` leave every byte of a text to exactly one token (see the module's docstring)."""
    normalizer = spec.get("normalizer")
    if normalizer is not None and not (normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")):
        return False  # a normalizer may shorten the text
    if spec.get("truncation") is not None:
        return False
    pre = _pre_tokenizers(spec.get("pre_tokenizer"))
    if not any(p.get("type") == "ByteLevel" for p in pre):
        return False
    if any(p.get("type") not in SPLITTING or p.get("behavior") == "Removed" for p in pre):
        return False
    return not any(a.get("lstrip") or a.get("rstrip") for a in spec.get("added_tokens") or [])


def utf8_length(text: str) -> int:
    """Return the UTF-8 byte length of ``text`` without encoding more than 1 MiB of it at a time."""
    if text.isascii():
        return len(text)
    return sum(len(text[i : i + CHUNK_CHARS].encode("utf-8")) for i in range(0, len(text), CHUNK_CHARS))


def _string_size(value: Any, measure: Callable[[str], int]) -> int:
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += measure(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def rule_out_too_long(
    sample: Sample, max_len: int, token_bytes: int, render: Callable[[Sample], str] | None = None
) -> None:
    """Raise RecordError("too_long") when ``sample`` certainly has more than ``max_len`` tokens.

    Text and prompt/completion samples are encoded as they are, so their bytes are known. A chat is
    encoded as its rendered template, which may leave content out: only when its strings alone exceed
    the limit is it rendered once (``render(sample)``, the encoder's own rendering) and measured.
    """
    limit = max_len * token_bytes
    if sample.kind == "text":
        n = utf8_length(sample.text or "")
    elif sample.kind == "prompt_completion":
        n = utf8_length(sample.prompt or "") + utf8_length(sample.completion or "")
    elif sample.kind == "chat" and render is not None:
        strings = [sample.messages, sample.tools]
        # A character is at most 4 UTF-8 bytes: most conversations are ruled in by counting characters.
        if 4 * _string_size(strings, len) <= limit or _string_size(strings, utf8_length) <= limit:
            return
        n = utf8_length(render(sample))
    else:
        return
    if n > limit:
        raise RecordError(
            "too_long",
            f"the sample has at least {-(-n // token_bytes)} tokens, more than ",
            Opt("max_len"),
            f" {max_len} ({n} bytes of text, at most {token_bytes} bytes a token)",
        )
