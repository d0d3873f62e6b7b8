"""What the fast encoder is known to do with a tokenizer, learned once and kept in the cache directory.

Choosing the fast encoder costs more than building it: each id's byte length is read out of the whole
``tokenizer.json`` (half a second for a 128k vocabulary), and a probe encodes a few hundred texts with
both encoders (another half second). None of it changes while the tokenizer and the two encoders'
versions do not, so the answers (``EncoderFacts``) are kept in the cache directory
(``tokenizers/KEY.encoder.npz``), keyed by a hash of the tokenizer's JSON and those versions: a later run
only builds the fast encoder, and a tokenizer it cannot serve is known without building it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packcli.owned import write_whole
from packcli.tokenize.encoders.recorded import RECORDS_DIR
from packcli.version import __version__

FACTS_FORMAT = 1


@dataclass(frozen=True)
class EncoderFacts:
    """``fast``: why the fast encoder cannot serve the tokenizer (None: it gives the reference's ids on the
    probe); ``adds_tokens``: whether it puts tokens around a text encoded with special tokens;
    ``byte_lengths``: each id's byte length for a plain byte-level BPE tokenizer (else None)."""

    fast: str | None
    adds_tokens: bool
    byte_lengths: np.ndarray | None


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
