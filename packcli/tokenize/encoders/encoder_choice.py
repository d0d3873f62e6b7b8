"""Which encoder a tokenizer gets (``choose``), and what is learned of it once, kept in the cache directory.

``auto`` takes the fast encoder (``text_encoders.FastEncoder``) when it loads the tokenizer and gives the
reference's ids and masks on every text of a probe (``packcli.tokenize.encoders.probe``), and when the
input is large enough to pay for its load (``Work``); otherwise the reference, with the reason.
``PACKCLI_ENCODER=tokenizers`` forces the reference whatever the option says.

Choosing the fast encoder costs more than building it: each id's byte length is read out of the whole
``tokenizer.json`` (half a second for a 128k vocabulary), and a probe encodes a few hundred texts with
both encoders (another half second). None of it changes while the tokenizer and the two encoders'
versions do not, so the answers (``EncoderFacts``) are kept in the cache directory
(``tokenizers/KEY.encoder.npz``), keyed by a hash of the tokenizer's JSON and those versions: a later run
only builds the fast encoder, and a tokenizer it cannot serve is known without building it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packcli.errors import Opt, TokenizerError
from packcli.owned import write_whole
from packcli.results import EncoderInfo
from packcli.tokenize.encoders.recorded import RECORDS_DIR
from packcli.tokenize.encoders.text_encoders import (
    FAST,
    REFERENCE,
    EncoderFacts,
    FastEncoder,
    FastUnavailable,
    ReferenceEncoder,
    TextEncoder,
)
from packcli.version import __version__

ENCODER_ENV = "PACKCLI_ENCODER"
# Below this many input bytes per worker process, ``auto`` encodes with the reference: the fast encoder
# takes longer to load (1.2 to 1.6 s for a 128k vocabulary, built once before the workers fork) than the
# reference takes to encode them (2.5 MB/s a process on real chat; the break-even measured at 3.1 to 3.4 MB:
# ``benchmarks/bench_fixed.py --cases break-even``).
FAST_MIN_BYTES = 4 << 20
# Once the cache knows the fast encoder's facts (no probe, no second parse), it loads in about 1 s and pays
# for itself from 2 to 3 MB of input, whatever the workers (measured at 1 and 2: small inputs barely gain
# from a second worker): ``benchmarks/bench_fixed.py --cases break-even``.
FAST_MIN_BYTES_KNOWN = 3 << 20

FACTS_FORMAT = 1


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def facts_key(backend_json: str) -> str:
    """The key of a tokenizer's facts: its JSON, the two encoders' versions and packcli's (its probe)."""
    h = hashlib.sha256(backend_json.encode("utf-8"))
    h.update(f"\0{_version('fastokens')}\0{_version('tokenizers')}\0{__version__}\0{FACTS_FORMAT}".encode())
    return h.hexdigest()[:32]


def _path(directory: Path, key: str) -> Path:
    return directory / RECORDS_DIR / f"{key}.encoder.npz"


def has_facts(directory: Path, key: str) -> bool:
    """Whether the cache ``directory`` keeps facts under ``key`` (without reading them)."""
    return _path(directory, key).is_file()


def read_facts(directory: Path | None, key: str) -> EncoderFacts | None:
    """The facts kept under ``key`` in the cache ``directory``; None when there are none (or damaged ones)."""
    if directory is None:
        return None
    try:
        with np.load(_path(directory, key), allow_pickle=False) as stored:
            meta = json.loads(str(stored["meta"]))
            lengths = stored["byte_lengths"] if meta["byte_lengths"] else None
            return EncoderFacts(meta["fast"], bool(meta["adds_tokens"]), lengths)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_facts(directory: Path | None, key: str, facts: EncoderFacts) -> None:
    """Keep ``facts`` in the cache ``directory``, whole or not at all (a directory that cannot take them is
    left as it is: the next run learns them again)."""
    if directory is None:
        return
    meta = {
        "fast": facts.fast,
        "adds_tokens": facts.adds_tokens,
        "byte_lengths": facts.byte_lengths is not None,
    }
    lengths = facts.byte_lengths if facts.byte_lengths is not None else np.zeros(0, np.int64)
    where = _path(directory, key)
    with contextlib.suppress(OSError):
        where.parent.mkdir(parents=True, exist_ok=True)
        write_whole(where, lambda fh: np.savez(fh, meta=np.array(json.dumps(meta)), byte_lengths=lengths))


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
    the cache directory that keeps what is learned of the tokenizer (``EncoderFacts``), or None.
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
