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

Which one a run uses is chosen once, when the tokenizer loads (``choose``): ``auto`` takes the fast one
when it loads the tokenizer and gives the reference's ids and masks on every text of a probe
(``packcli.tokenize.encoders.probe``); otherwise the reference, with the reason. ``PACKCLI_ENCODER=tokenizers``
forces the reference whatever the option says.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from packcli.errors import Opt, TokenizerError, first_line
from packcli.results import EncoderInfo
from packcli.tokenize.encoders.byte_offsets import byte_level_masks, ids_and_mask, token_byte_lengths
from packcli.tokenize.encoders.encoder_facts import EncoderFacts, facts_key, has_facts, read_facts, write_facts

ENCODER_ENV = "PACKCLI_ENCODER"
REFERENCE = "tokenizers"
FAST = "fastokens"
# Below this many input bytes per worker process, ``auto`` encodes with the reference: the fast encoder
# takes longer to load (1.2 to 1.6 s for a 128k vocabulary, built once before the workers fork) than the
# reference takes to encode them (2.5 MB/s a process on real chat; the break-even measured at 3.1 to 3.4 MB:
# ``benchmarks/bench_fixed.py --cases break-even``).
FAST_MIN_BYTES = 4 << 20
# Once the cache knows the fast encoder's facts (no probe, no second parse), it loads in about 1 s and pays
# for itself from 2 to 3 MB of input, whatever the workers (measured at 1 and 2: small inputs barely gain
# from a second worker): ``benchmarks/bench_fixed.py --cases break-even``.
FAST_MIN_BYTES_KNOWN = 3 << 20

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

    @classmethod
    def load(cls, backend_json: str, reference: ReferenceEncoder, known: EncoderFacts | None = None) -> FastEncoder:
        """Load ``fastokens`` on the tokenizer's JSON; raises ``FastUnavailable`` saying why it cannot.

        ``known``: what an earlier run learned of this tokenizer (its byte lengths are not read again).

        Unknown, the tokenizer is learned while ``fastokens`` builds its tables, which it does without the
        GIL: a thread opens the reference (whose offsets decide whether the fast encoder may be used) and
        reads the byte lengths out of the JSON, 0.45 of the build's 0.8 s for a 128k vocabulary. The build
        stays on the calling thread, so its tables, which the workers share, sit in the main heap.
        """
        if known is not None:  # it was checked then
            return cls(_native(backend_json), reference, known.adds_tokens, known.byte_lengths)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packcli-learn") as beside:
            learned = beside.submit(lambda: (offsets_trimmed(reference.backend), token_byte_lengths(backend_json)))
            try:
                native = _native(backend_json)
            except FastUnavailable:
                why, _ = learned.result()  # a trimmed offset is the reason, as when it was asked first
                if why is not None:
                    raise FastUnavailable(why) from None
                raise
            why, byte_lengths = learned.result()
        if why is not None:
            raise FastUnavailable(why)
        sample = "a b"
        adds = list(native.encode(sample, add_special_tokens=True).ids) != list(native.encode(sample).ids)
        return cls(native, reference, adds, byte_lengths)

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

        return probe_differences(self, reference)


def _native(backend_json: str) -> Any:
    """Build ``fastokens`` on the tokenizer's JSON; raises ``FastUnavailable`` saying why it cannot."""
    try:
        import fastokens

        return fastokens.Tokenizer.from_json_str(backend_json)
    except ImportError as exc:
        raise FastUnavailable(f"fastokens is not installed ({first_line(exc)})") from exc
    except Exception as exc:  # it raises ValueError, RuntimeError... for a tokenizer it does not support
        raise FastUnavailable(f"fastokens cannot load the tokenizer ({first_line(exc)})") from exc


@dataclass(frozen=True)
class Work:
    """What a run will encode: its inputs' bytes (at most), and the processes that share the encoding."""

    input_bytes: int
    workers: int

    def least(self, known: bool) -> int:
        """The fewest input bytes the fast encoder pays for; ``known``: the cache knows its facts."""
        return FAST_MIN_BYTES_KNOWN if known else FAST_MIN_BYTES * max(1, self.workers)

    def small(self, known: bool = False) -> bool:
        return self.input_bytes < self.least(known)

    def why_reference(self, known: bool = False) -> str:
        return (
            f"the input is small ({self.input_bytes / 1e6:.1f} MB, under {self.least(known) / 1e6:.0f} MB): "
            "tokenizers encodes it in less time than the fast encoder takes to load"
        )


class FastUnavailable(Exception):
    """The fast encoder cannot serve this tokenizer; the message says why (one line)."""


@dataclass(frozen=True)
class Choice:
    """The encoder a run uses, and why the fast one is not it (None when it is, or was not asked for)."""

    encoder: TextEncoder
    fallback: str | None

    def record(self) -> EncoderInfo:
        """What the summary and manifest say of it (records_slow is added by the run that counts them)."""
        return EncoderInfo(name=self.encoder.name, fallback=self.fallback)


def choose(
    backend: Any,  # the tokenizers backend, or what opens it
    backend_json: Callable[[], str],
    mode: str = "auto",
    work: Work | None = None,
    facts: Path | None = None,
) -> Choice:
    """Return the encoder for a tokenizer: ``mode`` auto, tokenizers or fast (see the module's doc).

    ``fast`` is ``auto`` that raises ``TokenizerError`` where ``auto`` would fall back (but for the
    environment variable, which forces the reference whatever the option). ``work``: what the run will
    encode, when known; ``auto`` takes the reference for less than ``FAST_MIN_BYTES`` a worker (or
    ``FAST_MIN_BYTES_KNOWN`` in all, where ``facts`` knows the fast encoder serves the tokenizer), unless
    the environment variable says ``fastokens`` (the tests of the fast encoder on small inputs).
    ``backend_json`` gives the tokenizer's JSON, asked for only when the fast encoder is tried. ``facts``:
    the cache directory that keeps what is learned of the tokenizer (``encoder_facts``), or None.
    """
    reference = ReferenceEncoder(backend)
    forced = os.environ.get(ENCODER_ENV, "").strip().lower()
    if forced == REFERENCE:
        return Choice(reference, f"{ENCODER_ENV}={REFERENCE}" if mode != REFERENCE else None)
    if mode == REFERENCE:
        return Choice(reference, None)
    if mode == "auto" and work is not None and work.small() and forced != FAST:
        known = not work.small(known=True) and _facts_known(backend_json(), facts)
        if not known:
            return Choice(reference, work.why_reference(known))
    fast, why = _fast_for(backend_json(), reference, facts)
    if fast is not None and why is None:
        return Choice(fast, None)
    if mode == "fast":
        raise TokenizerError(
            f"the fast encoder cannot be used with this tokenizer: {why}",
            hint=["pass ", Opt("encoder", "auto"), " to encode with tokenizers"],
        )
    return Choice(reference, why)


def _facts_known(backend_json: str, facts: Path | None) -> bool:
    """Whether the cache ``facts`` knows that the fast encoder serves this tokenizer (it then loads faster)."""
    known = read_facts(facts, facts_key(backend_json)) if facts is not None else None
    return known is not None and known.fast is None


def _fast_for(
    backend_json: str, reference: ReferenceEncoder, facts: Path | None
) -> tuple[FastEncoder | None, str | None]:
    """Return the fast encoder for a tokenizer (None where it cannot load) and why it is not exact (None)."""
    loaded, why, (key, learned) = _loaded(_Tokenizer(backend_json, reference, facts))
    if facts is not None:  # a cache directory other than the one this process loaded it for learns it too
        key = key or facts_key(backend_json)
        if not has_facts(facts, key):
            write_facts(facts, key, learned)
    if loaded is None:
        return None, why
    # The same native encoder; this run's reference and counts.
    return FastEncoder(loaded[0], reference, loaded[1], loaded[2]), why


class _Tokenizer:
    """A tokenizer by its JSON alone, with the reference encoder that loads and probes its fast encoder once."""

    def __init__(self, backend_json: str, reference: ReferenceEncoder | None, facts: Path | None) -> None:
        self.backend_json, self.reference, self.facts = backend_json, reference, facts

    def __hash__(self) -> int:
        return hash(self.backend_json)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Tokenizer) and other.backend_json == self.backend_json


# The fast encoders loaded in this process (native, adds_tokens, byte lengths), with their probe's
# verdict and what was learned of the tokenizer (its facts, under their key: "" where none was computed),
# by the tokenizer's JSON: loading one takes seconds, and a process that packs many times (the library,
# the tests) loads each tokenizer once. The reference encoder a run passes is not kept.
@functools.lru_cache(maxsize=4)
def _loaded(
    tokenizer: _Tokenizer,
) -> tuple[tuple[Any, bool, np.ndarray | None] | None, str | None, tuple[str, EncoderFacts]]:
    reference, tokenizer.reference = tokenizer.reference, None  # the key is kept, its reference not
    assert reference is not None
    key = facts_key(tokenizer.backend_json) if tokenizer.facts is not None else ""
    known = read_facts(tokenizer.facts, key) if tokenizer.facts is not None else None
    if known is not None and known.fast is not None:
        return None, known.fast, (key, known)  # an earlier run found it cannot serve this tokenizer: not built again
    try:
        fast = FastEncoder.load(tokenizer.backend_json, reference, known)
    except FastUnavailable as exc:
        learned = EncoderFacts(str(exc), False, None)
        write_facts(tokenizer.facts, key, learned)
        return None, str(exc), (key, learned)
    verdict = fast.probe(reference) if known is None else None
    learned = known or EncoderFacts(verdict, fast.adds_tokens, fast.byte_lengths)
    if known is None:
        write_facts(tokenizer.facts, key, learned)
    return (fast.native, fast.adds_tokens, fast.byte_lengths), verdict, (key, learned)


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
