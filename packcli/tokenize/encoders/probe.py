"""The probe a fast encoder must pass before a run uses it: edge-case texts encoded both ways.

Ids are compared on texts where BPE encoders are known to part ways (whitespace runs, digits, CJK,
emoji and joiners, combining marks, control characters, lone surrogates as JSON decodes them, every
added and special token alone and between text, long words); label masks on conversation-like texts
whose trained spans start and end beside those (``conversations``). A text both encoders refuse (a lone
surrogate) is no difference; one only one of them refuses is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

# (text, trained character spans), as packcli.tokenize.encoders.text_encoders.Item; the encoders are that
# module's (typed Any here: it imports this one).
Item = tuple[str, list[tuple[int, int]]]

# Texts of the kinds BPE encoders disagree on (the added tokens are added by ``probe_texts``).
EDGE_TEXTS = (
    "",
    " ",
    "a",
    "Hello, world!",
    "  two  spaces   three    four     ",
    "\n",
    "\n\n\n",
    "line\r\nline\rline\n\n  indented\n\t\ttabs\t \n",
    " \n \n x  \n\n",
    "trailing spaces   ",
    "\u00a0non-breaking\u00a0\u3000ideographic space\u2009thin",
    "0",
    "1234567890",
    "3.14159 2,718 1e-10 -42 +7 0x1F 1_000_000 ١٢٣ ４５６",
    "中文字符的测试，标点。“引号”",
    "日本語のテキストとカタカナ、ひらがな",
    "한국어 텍스트",
    "emoji 😀👍🏽👨\u200d👩\u200d👧 🇫🇷 ❤️ 🏳️\u200d🌈",
    "combining e\u0301 \u0065\u0308 Å \u212b ﬁ ㎞",
    "RTL עברית العربية mixed",
    "control \x00\x01\x07\x1b[0m \x7f \u200b\u200c\u200d\ufeff",
    "code:\n    def f(x):\n        return x ** 2  # comment\n",
    '{"key": [1, 2, {"nested": "va\\"lue"}], "url": "https://example.com/a?b=c&d=e"}',
    "a" * 3000,
    "supercalifragilisticexpialidocious" * 100,
    "9" * 1000,
    "😀" * 500,
    "中" * 2000,
    " " * 1000 + "x",
    "ab" + "\n" * 500 + "cd",
)

# Texts as JSON gives them when a record escapes half a UTF-16 pair ("\ud800"); records with them are
# refused before encoding, but an encoder must not give ids for them either where the other refuses.
SURROGATE_JSON = ('"\\ud800"', '"x\\udfffy"', '"\\ud83d\\ude00 and \\ude00\\ud83d"')


def probe_texts(added: list[str]) -> list[str]:
    """Return the probe's texts: the edge cases, then every added token alone, between text, and all together."""
    texts = list(EDGE_TEXTS)
    for token in added:
        texts += [token, f"x{token}y", f" {token} ", f"\n{token}\n\n", f"{token}{token}", f"1{token}中"]
    if added:
        texts.append("".join(added))
        texts.append(" a ".join(added))
    return texts


def conversations(added: list[str]) -> list[Item]:
    """Return conversation-like texts and their trained spans, with special tokens around the answers."""
    start, end = [added[0], added[-1]] if len(added) >= 2 else ["<|im_start|>", "<|im_end|>"]
    answers = ("Hello! 123 😀", "  spaced answer  ", "\n\nleading newlines", "中文回答。", "a" * 300, " ", "x\n")
    out: list[Item] = []
    for answer in answers:
        for header in ("assistant\n", "assistant: ", "assistant"):
            for trained_end in (True, False):
                prefix = f"{start}user\nQuestion 42?{end}\n{start}{header}"
                text = prefix + answer + end + "\n"
                stop = len(prefix) + len(answer) + (len(end) if trained_end else 0)
                out.append((text, [(len(prefix), stop)]))
    # Markers that are plain text (a template not of this tokenizer's model), where BPE merges across
    # the span's ends, and spans that end inside a word, a number, a CJK run or an emoji sequence.
    for start, end in (("<|im_start|>", "<|im_end|>"), ("### Response:", "</s>")):
        for answer in ("Hello.", " spaced ", "x", "😀👍🏽", "12345"):
            prefix = f"{start}assistant\n"
            text = prefix + answer + end + "\n"
            out.append((text, [(len(prefix), len(prefix) + len(answer) + len(end))]))
            out.append((text, [(len(prefix) - 1, len(prefix) + len(answer))]))
    inside = "unbelievable 1234567 中文字符测试 👨\u200d👩\u200d👧 ok"
    out += [(inside, [(a, b)]) for a, b in ((2, 9), (15, 17), (21, 24), (28, 31), (27, 29), (0, len(inside)))]
    # The whole text trained (text samples), and a prompt then its completion.
    out.append(("Plain text to learn, all of it. 1234", [(0, 36)]))
    out.append(("Question: why?\nAnswer: because.", [(15, 31)]))
    return out


def _ids_or_error(encoder: Any, texts: list[str], add_special: bool) -> list[Any]:
    """Each text's ids as a tuple, or the kind of error its encoding raised (texts encoded one by one
    where the batch raises, so that one refused text does not hide the others)."""
    try:
        ids, starts = encoder.encode_flat(texts, add_special)
        return [tuple(ids[starts[k] : starts[k + 1]].tolist()) for k in range(len(texts))]
    except Exception:  # a text the encoder refuses (a lone surrogate): find which
        out: list[Any] = []
        for text in texts:
            try:
                ids, _ = encoder.encode_flat([text], add_special)
                out.append(tuple(ids.tolist()))
            except Exception:  # any refusal counts the same, as long as both refuse
                out.append("refused")
        return out


@dataclass(frozen=True)
class Expected:
    """What the reference gives on the probe (``expected_of``): the texts' ids (or refusals), by group of texts
    and with special tokens or not, and the conversations' ids and masks."""

    added: list[str]
    ids: list[list[Any]]  # as ``_groups`` orders them
    masks: list[Any]


def expected_of(reference: Any) -> Expected:
    """The reference's side of the probe, which needs no fast encoder: made while it builds (``FastEncoder.load``)."""
    added = sorted(_added_tokens(reference))
    ids = [_ids_or_error(reference, texts, add_special) for texts, add_special in _groups(added)]
    return Expected(added, ids, reference.encode_pieces(conversations(added), False))


def _groups(added: list[str]) -> list[tuple[list[str], bool]]:
    """The probe's texts, without and with special tokens; the surrogates apart (a refused text makes its
    batch go one by one)."""
    surrogates = [json.loads(s) for s in SURROGATE_JSON]
    return [(texts, add_special) for texts in (probe_texts(added), surrogates) for add_special in (False, True)]


def probe_differences(fast: Any, reference: Any, expected: Expected | None = None) -> str | None:
    """Return the first way ``fast`` differs from ``reference`` on the probe (None: on none of it);
    ``expected``: the reference's side, made already."""
    expected = expected or expected_of(reference)
    for (texts, add_special), theirs in zip(_groups(expected.added), expected.ids, strict=True):
        mine = _ids_or_error(fast, texts, add_special)
        for text, a, b in zip(texts, mine, theirs, strict=True):
            if a != b:
                shown = json.dumps(text[:40])
                return f"fastokens gives other ids than tokenizers for the probe text {shown}"
    items = conversations(expected.added)
    made = fast.masked_or_none(items)
    for (text, _), got, want in zip(items, made, expected.masks, strict=True):
        if got is None:
            continue  # such a record takes the reference's path: slower, never different
        if not (np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])):
            return f"fastokens' label mask differs from tokenizers' for the probe text {json.dumps(text[:40])}"
    if all(got is None for got in made):
        return "fastokens cannot make the label mask of any probe text with this tokenizer: masks need offsets"
    return None


def _added_tokens(reference: Any) -> set[str]:
    """The added vocabulary's contents (special or not), as the reference backend lists them."""
    decoder = reference.backend.get_added_tokens_decoder()
    return {token.content for token in decoder.values() if token.content}
