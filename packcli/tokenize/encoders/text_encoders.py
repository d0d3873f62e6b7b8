"""Text to token ids and label masks: the reference encoder and a fast exact one, behind one protocol.

The reference is the ``tokenizers`` backend ``apply_chat_template`` encodes with; its label masks come
from character offsets (``byte_offsets.span_mask``). The fast one is ``fastokens``, a Rust BPE encoder
that loads the same ``tokenizer.json`` and returns ids in one flat buffer, without offsets. For a plain
byte-level BPE tokenizer it makes a mask from the ids' byte lengths (``byte_offsets.byte_level_masks``,
a batch at a time). Otherwise it encodes the pieces of a text between the trained spans' boundaries:
where the pieces' ids, one after the other, equal the whole text's ids, each token lies inside one
piece, and a token is trained when its piece is. That is the offset rule's answer whenever every token
covers at least one character of its own piece, which holds unless a post-processor trims the offsets
(then the fast encoder is not used). A record either method cannot vouch for takes the reference path,
and is counted.

Which one a run uses is chosen once, when the tokenizer loads (``encoder_choice.choose``).
"""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from packcli.errors import first_line
from packcli.tokenize.encoders.byte_offsets import byte_level_masks, ids_and_mask, token_byte_lengths

REFERENCE = "tokenizers"
FAST = "fastokens"
# (text, the trained character spans): what a masked encode takes per text.
Item = tuple[str, list[tuple[int, int]]]
Masked = tuple[np.ndarray, np.ndarray]  # int32 ids, bool mask


class TextEncoder(Protocol):
    """What turns texts into token ids and label masks; the same ids from every implementation."""

    name: str
    # Texts whose label masks this encoder could not make itself and left to the reference (per process).
    slow_records: int

    def encode_flat(self, texts: list[str], add_special: bool) -> tuple[np.ndarray, np.ndarray]:
        """Return every text's ids, one after the other (int32), and where each starts (int64, n + 1)."""
        ...

    def encode_pieces(self, items: list[Item], add_special: bool) -> list[Masked]:
        """Return (int32 ids, bool mask of the tokens inside the spans) for each (text, spans)."""
        ...

    def probe(self, reference: TextEncoder) -> str | None:
        """Return why this encoder differs from ``reference`` on the probe texts (None: it does not)."""
        ...


class ReferenceEncoder:
    """The ``tokenizers`` backend: ids from ``encode_batch``, masks from character offsets.

    Made with the backend, or with what opens it (a callable): then the backend is opened when first
    used, which a run the fast encoder serves whole never does.
    """

    name = REFERENCE

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._open = backend if callable(backend) else None
        self.slow_records = 0

    @property
    def backend(self) -> Any:
        if callable(self._backend):
            self._backend = self._backend()
        return self._backend

    def forget(self) -> None:
        """Let go of the backend when it was opened by what it was made with: the next use opens it again."""
        if self._open is not None:
            self._backend = self._open

    def encode_flat(self, texts: list[str], add_special: bool) -> tuple[np.ndarray, np.ndarray]:
        done = self.backend.encode_batch(texts, add_special_tokens=add_special)
        return _flat([np.asarray(enc.ids, dtype=np.int32) for enc in done])

    def encode_pieces(self, items: list[Item], add_special: bool) -> list[Masked]:
        done = self.backend.encode_batch([text for text, _ in items], add_special_tokens=add_special)
        return [ids_and_mask(enc, spans, len(text)) for (text, spans), enc in zip(items, done, strict=True)]

    def probe(self, reference: TextEncoder) -> str | None:
        return None


class FastEncoder:
    """``fastokens``: ids from one flat buffer; masks from the pieces between span boundaries."""

    name = FAST

    def __init__(
        self, native: Any, reference: ReferenceEncoder, adds_tokens: bool, byte_lengths: np.ndarray | None = None
    ) -> None:
        self.native = native
        self.reference = reference
        # Whether add_special_tokens puts tokens around a text (a BOS...): such texts' masks are the reference's.
        self.adds_tokens = adds_tokens
        # Each id's byte length, for a plain byte-level BPE tokenizer (packcli.tokenize.encoders.byte_offsets): masks
        # from the ids alone. None: masks from the pieces between span boundaries.
        self.byte_lengths = byte_lengths
        self.slow_records = 0
        self.expected: Any = None  # the reference's side of the probe, where the load made it (``probe.Expected``)

    @classmethod
    def load(cls, backend_json: str, reference: ReferenceEncoder, known: EncoderFacts | None = None) -> FastEncoder:
        """Load ``fastokens`` on the tokenizer's JSON; raises ``FastUnavailable`` saying why it cannot.

        ``known``: what an earlier run learned of this tokenizer (its byte lengths are not read again).

        Unknown, the tokenizer is learned while ``fastokens`` builds its tables, which it does without the
        GIL: a thread opens the reference (whose offsets decide whether the fast encoder may be used), reads
        the byte lengths out of the JSON and encodes the probe's texts with the reference (``probe.expected_of``),
        0.55 of the build's 0.8 s for a 128k vocabulary. The build stays on the calling thread, so its
        tables, which the workers share, sit in the main heap.
        """
        if known is not None:  # it was checked then
            return cls(_native(backend_json), reference, known.adds_tokens, known.byte_lengths)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packcli-learn") as beside:
            learned = beside.submit(_learn, reference, backend_json)
            try:
                native = _native(backend_json)
            except FastUnavailable:
                why, _, _ = learned.result()  # a trimmed offset is the reason, as when it was asked first
                if why is not None:
                    raise FastUnavailable(why) from None
                raise
            why, byte_lengths, expected = learned.result()
        if why is not None:
            raise FastUnavailable(why)
        sample = "a b"
        adds = list(native.encode(sample, add_special_tokens=True).ids) != list(native.encode(sample).ids)
        fast = cls(native, reference, adds, byte_lengths)
        fast.expected = expected
        return fast

    def encode_flat(self, texts: list[str], add_special: bool) -> tuple[np.ndarray, np.ndarray]:
        ids, starts = self.native.encode_batch_flat(texts, add_special_tokens=add_special)
        return (
            np.frombuffer(ids, dtype="<u4").astype(np.int32),
            np.frombuffer(starts, dtype="<u8").astype(np.int64),
        )

    def encode_pieces(self, items: list[Item], add_special: bool) -> list[Masked]:
        if add_special and self.adds_tokens:
            return self.reference.encode_pieces(items, add_special)
        made = self.masked_or_none(items)
        slow = [k for k, pair in enumerate(made) if pair is None]
        if slow:
            self.slow_records += len(slow)
            for k, pair in zip(slow, self.reference.encode_pieces([items[k] for k in slow], add_special), strict=True):
                made[k] = pair
        return made  # type: ignore[return-value]

    def masked_or_none(self, items: list[Item]) -> list[Masked | None]:
        """Return each text's ids and mask, or None where this encoder cannot vouch for its mask.

        From the ids' byte lengths for a plain byte-level BPE tokenizer, else from the pieces.
        """
        if self.byte_lengths is None:
            return self.pieces_or_none(items)
        ids, starts = self.encode_flat([text for text, _ in items], False)
        masks = byte_level_masks(ids, starts, items, self.byte_lengths)
        return [None if mask is None else (ids[starts[k] : starts[k + 1]], mask) for k, mask in enumerate(masks)]

    def pieces_or_none(self, items: list[Item]) -> list[Masked | None]:
        """Return each text's ids and mask from its pieces, or None where the pieces differ from the whole.

        One flat call encodes the wholes, then every piece of the texts that have more than one.
        """
        cuts = [piece_cuts(text, spans) for text, spans in items]
        texts = [text for text, _ in items]
        pieces: list[str] = []
        first_piece: list[int] = []
        for (text, _), (bounds, _) in zip(items, cuts, strict=True):
            first_piece.append(len(pieces))
            if len(bounds) > 2:
                pieces.extend(text[a:b] for a, b in itertools.pairwise(bounds))
        ids, starts = self.encode_flat(texts + pieces, False)
        n = len(items)
        out: list[Masked | None] = []
        for k, (bounds, trained) in enumerate(cuts):
            whole = ids[starts[k] : starts[k + 1]]
            if len(bounds) <= 2:  # one piece: the whole, trained or not
                out.append((whole, np.full(len(whole), bool(trained and trained[0]), dtype=bool)))
                continue
            p = n + first_piece[k]
            joined = ids[starts[p] : starts[p + len(trained)]]
            if not np.array_equal(joined, whole):
                out.append(None)
                continue
            mask = np.zeros(len(whole), dtype=bool)
            base = starts[p]
            for j, on in enumerate(trained):
                if on:
                    mask[starts[p + j] - base : starts[p + j + 1] - base] = True
            out.append((whole, mask))
        return out

    def probe(self, reference: TextEncoder) -> str | None:
        from packcli.tokenize.encoders.probe import probe_differences

        expected = self.expected if reference is self.reference else None
        self.expected = None  # asked once; its ids held no longer
        return probe_differences(self, reference, expected)


def _learn(reference: ReferenceEncoder, backend_json: str) -> tuple[str | None, np.ndarray | None, Any]:
    """What a first load learns beside the build: why the fast encoder may not be used (trimmed offsets),
    the ids' byte lengths, and the reference's side of the probe (where the fast encoder may be used)."""
    from packcli.tokenize.encoders.probe import expected_of

    why = offsets_trimmed(reference.backend)
    lengths = token_byte_lengths(backend_json)
    return why, lengths, (expected_of(reference) if why is None else None)


def _native(backend_json: str) -> Any:
    """Build ``fastokens`` on the tokenizer's JSON; raises ``FastUnavailable`` saying why it cannot."""
    try:
        import fastokens

        return fastokens.Tokenizer.from_json_str(backend_json)
    except ImportError as exc:
        raise FastUnavailable(f"fastokens is not installed ({first_line(exc)})") from exc
    except Exception as exc:  # it raises ValueError, RuntimeError... for a tokenizer it does not support
        raise FastUnavailable(f"fastokens cannot load the tokenizer ({first_line(exc)})") from exc


class FastUnavailable(Exception):
    """The fast encoder cannot serve this tokenizer; the message says why (one line)."""


@dataclass(frozen=True)
class EncoderFacts:
    """What the fast encoder is known to do with a tokenizer (learned once, kept by ``encoder_choice``).

    ``fast``: why the fast encoder cannot serve the tokenizer (None: it gives the reference's ids on the
    probe); ``adds_tokens``: whether it puts tokens around a text encoded with special tokens;
    ``byte_lengths``: each id's byte length for a plain byte-level BPE tokenizer (else None)."""

    fast: str | None
    adds_tokens: bool
    byte_lengths: np.ndarray | None


def piece_cuts(text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[bool]]:
    """Return the boundaries of the text's pieces (0 ... len(text)) and whether each piece is trained.

    The boundaries are the spans' ends; a piece lies wholly inside a span or wholly outside all of them.
    Empty pieces are left out.
    """
    n = len(text)
    kept = [(max(0, a), min(n, b)) for a, b in spans if min(n, b) > max(0, a)]
    bounds = sorted({0, n, *(a for a, _ in kept), *(b for _, b in kept)})
    if n == 0:
        return [0, 0], []
    trained = [any(a <= x and y <= b for a, b in kept) for x, y in itertools.pairwise(bounds)]
    return bounds, trained


def offsets_trimmed(backend: Any) -> str | None:
    """Return why masks need the reference's offsets: a post-processor that trims them; None otherwise.

    A trimmed offset leaves a whitespace token covering no character, which the offset rule never trains,
    while its piece may be trained.
    """
    post = backend.post_processor
    if post is None:
        return None
    try:
        spec = json.loads(post.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return "the tokenizer's post-processor cannot be read"
    if _has_true(spec, "trim_offsets"):
        return "the tokenizer's post-processor trims offsets, which label masks follow"
    return None


def _has_true(value: Any, key: str) -> bool:
    if isinstance(value, dict):
        return value.get(key) is True or any(_has_true(v, key) for v in value.values())
    if isinstance(value, list):
        return any(_has_true(v, key) for v in value)
    return False


def _flat(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=starts[1:])
    ids = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
    return ids.astype(np.int32, copy=False), starts
