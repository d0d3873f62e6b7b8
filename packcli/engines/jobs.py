"""The jobs a run gives its engine: each says, in one typed object, what to make and with what.

``WholeStore`` and ``CacheParts`` are the two kinds of ``Engine.tokenize`` job, ``WriteJob`` is
``Engine.write``'s, ``HashJob`` is ``FileHashing.hash_files``'s. A job is frozen: the engine reads it
and does not change it (what it makes comes back as the method's result, or, for cache parts, in the
inputs' ``InputParts.made``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from packcli.contract import Progress
from packcli.io.sources import InputSource
from packcli.output.layout import RowLayout
from packcli.plan.planner import Plan
from packcli.results import FileDigest
from packcli.store.parts import InputParts
from packcli.store.tokens import TokenStore
from packcli.tokenize.options import TokenizeOptions

if TYPE_CHECKING:
    from packcli.tokenize.encoders.encoder import Encoder

# Checks a found cache entry's token files: (the entry's directory, its files' entries by name).
DigestChecker = Callable[[str, dict[str, FileDigest]], None]


@dataclass(frozen=True, kw_only=True)
class TokenizeJob:
    """What every tokenize job holds: the stage's options, the inputs' record formats (by display name),
    the encoder, where progress goes, and whether records certainly longer than --max-len are dropped
    untokenized (``rule_out_long``: an engine may tokenize them all instead, as the Ray engine does)."""

    options: TokenizeOptions
    formats: dict[str, str | None]
    encoder: Encoder
    progress: Progress
    rule_out_long: bool = False


@dataclass(frozen=True, kw_only=True)
class WholeStore(TokenizeJob):
    """Tokenize every record of ``sources`` into one token store at ``path`` (``ingest.tokenize_to_store``).

    ``before_finish`` runs once every record is read, before the store is moved into place, given the
    hashes of the files the engine read through in this process (by path); what it raises leaves no store.
    It may return where the store goes instead of ``path`` (in the same directory: the run's cache entry,
    keyed by hashes taken as the inputs were read).
    """

    sources: list[InputSource]
    path: Path
    before_finish: Callable[[dict[str, str]], Path | None] | None = None


@dataclass(frozen=True, kw_only=True)
class CacheParts(TokenizeJob):
    """Tokenize what the cache lacks of each input into cache parts under ``cache_root``
    (``ingest.tokenize_to_parts``), each committed as it is finished: ``inputs[k].made`` receives them.

    ``unchanged(source)`` runs before a part of ``source`` is committed (it raises if the input changed
    since it was hashed); ``hold(key)`` before a part is begun (the run locks it).
    """

    inputs: list[InputParts]
    cache_root: Path
    unchanged: Callable[[InputSource], None] | None = None
    hold: Callable[[str], None] | None = None


@dataclass(frozen=True)
class MadeParts:
    """What tokenizing into cache parts gives back besides the parts: the seconds by stage, and the hashes
    of the files the engine read through in this process, taken as it read them (by path; empty when the
    engine reads them elsewhere)."""

    seconds: dict[str, float]
    read_digests: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class WriteJob:
    """Write the plan's rows of ``store`` as shards: into ``directory`` (the staged output), or, when it
    is None, straight to ``layout.output``, a filesystem URI (only an engine with ``uri_output``)."""

    layout: RowLayout
    store: TokenStore
    plan: Plan
    directory: Path | None
    progress: Progress


@dataclass(frozen=True)
class HashJob:
    """Hash ``files`` where the engine reads them. ``again``: the inputs hashed again once they are read
    (did one change?), while the engine's tokenizers may still hold every CPU."""

    files: list[str]
    again: bool = False
