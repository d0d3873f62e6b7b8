"""Samples to token ids and labels, exactly as the tokenizer and its chat template give them.

The token ids of a conversation are those of ``tokenizer.apply_chat_template(messages, tokenize=True)``:
the template is rendered with the same renderer and keyword arguments (``packcli.tokenize.templates.chat_template``),
and the text is encoded by the same fast tokenizer with ``add_special_tokens=False``. Label masks follow
``return_assistant_tokens_mask=True``: a token is trained when its character span overlaps a trained
character span. The spans come from the template's ``{% generation %}`` blocks when it has them, and
otherwise from the rendering of the whole conversation (``packcli.tokenize.templates.spans``). Truncation and
padding settings in ``tokenizer.json`` are turned off, as ``apply_chat_template`` turns them off
(``packcli.tokenize.encoders.tokenizer.plain_backend``). Which tokenizer and template:
``packcli.tokenize.encoders.tokenizer`` and ``packcli.tokenize.templates.choice``.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from packcli.config import flag_term
from packcli.contract import IGNORE_INDEX, vocab_sha256
from packcli.errors import Message, RecordError
from packcli.jsontypes import TemplateKwargs
from packcli.records.formats import Sample
from packcli.results import TokenizerIdentity
from packcli.tokenize.encoders import encoder_choice, text_encoders
from packcli.tokenize.encoders.byte_offsets import ids_and_mask, span_mask
from packcli.tokenize.encoders.tokenizer import DEFAULT_TOKENIZER, open_tokenizer, plain_backend, tokenizer_sha256
from packcli.tokenize.images import Encoded, expand_images, image_tokens_masked
from packcli.tokenize.long import long_text
from packcli.tokenize.long.bounds import max_token_bytes
from packcli.tokenize.long.long_text import NO_AFFIXES, Affixes, Joined
from packcli.tokenize.options import EncodeOptions
from packcli.tokenize.templates.agentic import Reasoning
from packcli.tokenize.templates.chat_template import ChatTemplate
from packcli.tokenize.templates.choice import TemplateChoice, choose_template, no_template
from packcli.tokenize.templates.template_shape import TemplateShape


class Encoder:
    """Turns Samples into (input_ids, labels) int32 arrays, in batches."""

    def __init__(
        self,
        tokenizer_name: str | None,
        chat_template_file: str | None,
        options: EncodeOptions,
        processor: str | None = None,
        encoder: str = "auto",
        records: Path | None = None,
        work: encoder_choice.Work | None = None,
    ) -> None:
        self.tokenizer_name = tokenizer_name or DEFAULT_TOKENIZER
        # --processor DIR: its tokenizer (the run's tokenizer is DIR), its chat template, its image rule.
        self.vision: Any = None
        if processor is not None:
            from packcli.vision import load_processor

            self.vision = load_processor(processor)
        self.tokenizer = open_tokenizer(tokenizer_name, records)
        self.record = getattr(self.tokenizer, "record", None)  # a tokenizer opened from its record knows its facts
        if self.record is not None:
            self.overrides: tuple[str, ...] = self.record.overridden  # its backend opened when first asked for
        else:
            self.backend, self.overrides = plain_backend(self.tokenizer.backend_tokenizer)
        # The text encoder, chosen once (packcli.tokenize.encoders.encoder_choice): the fast one where it is exact.
        self.choice = encoder_choice.choose(lambda: self.backend, lambda: self.backend_json, encoder, work, records)
        if self.record is not None and not self.overrides:
            # Read again from the record if ever asked for: held, it is a copy in memory the size of the file
            # (48 MB for Gemma 3's) that no worker uses.
            self.__dict__.pop("backend_json", None)
        self.text = self.choice.encoder
        self.options = options
        added = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.content}
        if self.vision is not None and chat_template_file is None and self.vision.chat_template:
            choice = TemplateChoice(self.vision.chat_template, "processor", "processor", f"processor '{processor}'")
        else:
            choice = choose_template(chat_template_file, self.tokenizer.chat_template, added)
        template, source = choice.text, choice.source
        # The manifest's chat_template and chat_template_source (templates.TemplateChoice).
        self.template_name, self.template_origin = choice.name, choice.origin
        kwargs = dict(self.tokenizer.special_tokens_map) | options.kwargs()
        self.chat = ChatTemplate(template, source, kwargs, added)
        if choice.guessed:
            self.chat.refused = functools.partial(no_template, self.tokenizer_name)
        self.chat.images = self.vision is not None
        self.image_token_id = self.vision.token_id(self.tokenizer) if self.vision is not None else None
        self.eos_id = self.tokenizer.eos_token_id
        self.vocab_size = len(self.tokenizer)
        # A text of more UTF-8 bytes than this certainly has more tokens than a row holds: it is encoded by
        # windows (packcli.tokenize.long.long_text), in bounded memory. Set by the run (--overflow truncate or
        # split, with a tokenizer that bounds bytes per token); None: every text is encoded whole.
        self.long_text_bytes: int | None = None
        self.warnings: list[Message] = self.chat.marker_warnings(self._count, self.tokenizer_name)

    def _count(self, text: str) -> int:
        """A text's tokens, by the run's text encoder (the fast one gives the reference's ids)."""
        return len(self.text.encode_flat([text], False)[0])

    def identity(self) -> TokenizerIdentity:
        """Return what identifies the tokenizer and template, for the manifest and the cache key."""
        return {
            "name": self.tokenizer_name,
            "sha256": self.record.sha256
            if self.record is not None
            else tokenizer_sha256(self.backend_json, self.tokenizer.special_tokens_map),
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
            "warnings": [w.render(flag_term) for w in self.warnings],  # as the manifest records them
        }

    @functools.cached_property
    def vocab_sha256(self) -> str:
        """The vocabulary's fingerprint (contract.vocab_sha256), which a trainer checks its tokenizer against."""
        recorded = getattr(self.tokenizer, "vocab_sha256", None)  # a recorded tokenizer knows it
        return recorded if isinstance(recorded, str) else vocab_sha256(self.tokenizer.get_vocab())

    @functools.cached_property
    def max_token_bytes(self) -> int | None:
        """The most text bytes one token covers (``tokenize.long.bounds``), or None: from the tokenizer's record
        when it has one (the bound is read out of the whole ``tokenizer.json``, a third of a second)."""
        if self.record is not None and not self.overrides:
            return self.record.max_token_bytes
        return max_token_bytes(self.backend_json)

    @functools.cached_property
    def backend(self) -> Any:
        """The ``tokenizers`` backend with truncation and padding off (``plain_backend``), opened when first
        asked for where the tokenizer came from its record (the reference encoder, long texts, images)."""
        return plain_backend(self.tokenizer.backend_tokenizer)[0]

    def drop_backend(self) -> None:
        """Let go of the ``tokenizers`` backend where the tokenizer's record opens it again when asked for: a run
        the fast encoder serves whole opened it only for the probe, and its workers would inherit it unused
        (a record the fast encoder cannot vouch for opens it in its worker)."""
        if self.record is None or self.overrides or self.text.name != text_encoders.FAST:
            return
        self.__dict__.pop("backend", None)
        self.tokenizer.__dict__.pop("backend_tokenizer", None)
        reference = getattr(self.text, "reference", None)
        if isinstance(reference, text_encoders.ReferenceEncoder):
            reference.forget()

    @functools.cached_property
    def backend_json(self) -> str:
        """The backend tokenizer as JSON text: the record's, or ``tokenizer.json`` as it is, without opening
        it; else made from the backend (0.1 s for a 128k vocabulary). What the fast encoder is built from."""
        if self.record is not None and not self.overrides:
            text: str = self.tokenizer.backend_text()
            return text
        return str(self.backend.to_str())

    # -- the chat template (self.chat), for callers that render as the encoder does ------------------

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
    def template_kwargs(self) -> TemplateKwargs:
        return self.chat.template_kwargs

    def shape(self, kwargs: TemplateKwargs | None = None) -> TemplateShape:
        """Return the template's assistant header and end markers."""
        return self.chat.shape(kwargs)

    # -- encoding ----------------------------------------------------------------------------------

    def encode_batch(self, samples: list[Sample | RecordError]) -> list[tuple[np.ndarray, np.ndarray] | RecordError]:
        """Return (input_ids, labels) for each sample, or the RecordError that rules it out."""
        results: list[Any] = list(samples)
        jobs: dict[bool, list[tuple[int, str, list[tuple[int, int]], bool]]] = {True: [], False: []}
        reasoning: dict[int, Reasoning] = {}  # sample -> its trained turns' reasoning, where some have any
        for i, sample in enumerate(samples):
            if isinstance(sample, RecordError):
                continue
            try:
                if self.vision is not None and sample.kind == "chat":
                    shown = self.chat.rendered(sample, self.options.train_on)
                    results[i] = self._encode_images(sample, shown.text, shown.spans)
                    results[i].reasoning = shown.reasoning
                elif sample.kind == "chat":
                    shown = self.chat.rendered(sample, self.options.train_on)
                    jobs[False].append((i, shown.text, shown.spans, False))
                    if shown.reasoning is not None:
                        reasoning[i] = shown.reasoning
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
            made = self.encode_spans([(b[1], b[2]) for b in batch], add_special)
            for (i, text, spans, eos), (ids, mask) in zip(batch, made, strict=True):
                if not text:
                    results[i] = RecordError("empty", "the sample's text is empty")
                    continue
                if (
                    eos
                    and self.options.add_eos
                    and self.eos_id is not None
                    and (not len(ids) or ids[-1] != self.eos_id)
                ):
                    ids = np.append(ids, np.int32(self.eos_id))
                    mask = np.append(mask, bool(spans) and spans[-1][1] >= len(text))
                try:
                    results[i] = finish(ids, mask)
                except RecordError as err:
                    results[i] = err
                    continue
                if i in reasoning:
                    results[i] = Encoded(results[i])
                    results[i].reasoning = reasoning[i]
        return results

    def encode_spans(
        self, items: list[tuple[str, list[tuple[int, int]]]], add_special: bool
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Return (int32 ids, bool mask of the tokens overlapping the spans) for each (text, spans).

        Texts certainly too long for a row are encoded by windows here; the others in one batch call of
        the run's text encoder (``self.text``).
        """
        out: list[Any] = [None] * len(items)
        whole: list[int] = []
        for k, (text, spans) in enumerate(items):
            enc = self._encode_long(text, add_special)
            if enc is None:
                whole.append(k)
            else:
                out[k] = ids_and_mask(enc, spans, len(text))
        if not whole:
            return out
        made = self.text.encode_pieces([items[k] for k in whole], add_special)
        for k, pair in zip(whole, made, strict=True):
            out[k] = pair
        return out

    def _encode_images(self, sample: Sample, text: str, spans: list[tuple[int, int]]) -> Encoded:
        """Encode a conversation of a run with a processor as the processor does (``packcli.tokenize.images``).

        Special tokens are added unless the text starts with the BOS token, as
        ``ProcessorMixin.apply_chat_template`` decides; image tokens are never trained.
        """
        expanded = expand_images(self.vision, sample, text, spans)
        bos = self.tokenizer.bos_token
        add_special = not (bos is not None and expanded.text.startswith(bos))
        enc = self.backend.encode(expanded.text, add_special_tokens=add_special)
        ids = np.asarray(enc.ids, dtype=np.int32)
        if not len(ids):
            raise RecordError("empty", "the sample's text is empty")
        mask = span_mask(enc, expanded.spans, len(ids), len(expanded.text))
        assert self.image_token_id is not None
        images = image_tokens_masked(enc, ids, mask, expanded, self.image_token_id)
        out = Encoded(finish(ids, mask))
        out.images = images
        return out

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

        None also where the windows cannot be joined (see ``long_text.encode_windows``): the text is then
        encoded whole.
        """
        if not long_text.certainly_long(text, self.long_text_bytes):
            return None
        affixes = self._special_affixes() if add_special else NO_AFFIXES
        if affixes is None:
            return None
        return long_text.encode_long(self.backend, text, affixes)

    @functools.cache  # noqa: B019 - one encoder a run; the probe is tiny
    def _special_affixes(self) -> Affixes | None:
        return long_text.special_affixes(self.backend)

    def _tokenized(self, sample: Sample) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(sample.input_ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise RecordError(
                "token_out_of_range", f"input_ids hold ids outside the tokenizer's vocabulary [0, {self.vocab_size})"
            )
        ids = ids.astype(np.int32)
        if sample.labels is None:
            return finish(ids, np.ones(len(ids), dtype=bool))
        labels = np.asarray(sample.labels, dtype=np.int64)
        trained = labels != IGNORE_INDEX
        if np.any(labels[trained] != ids[trained]):
            raise RecordError("bad_labels", "labels must equal input_ids where they are not -100 (unshifted labels)")
        return finish(ids, trained)


def finish(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(ids) == 0:
        raise RecordError("empty", "the sample has no tokens")
    labels = np.where(mask, ids, IGNORE_INDEX).astype(np.int32)
    labels[0] = IGNORE_INDEX
    if not np.any(labels != IGNORE_INDEX):
        raise RecordError("nothing_to_train", "no token of the sample is trained on (all labels are -100)")
    return ids, labels
