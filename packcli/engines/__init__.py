"""Engines: where tokenizing and shard writing run. One small interface, one class per engine.

The run (``packcli.run.pipeline``) makes one engine per run (``load_engine``) and uses only the
members of ``Engine``: what varies from one engine to another. It hands each method one job
(``packcli.engines.jobs``: ``WholeStore`` or ``CacheParts`` to tokenize, ``WriteJob`` to write) and reads
two capabilities: ``hashing`` (who hashes files where the engine reads them) and ``uri_output``
(whether it writes to a filesystem URI). What is the same for every engine stays in the run: checking
a URI output and writing its manifest (``io.uri``), removing a scratch store
(``TokenStore.discard_elsewhere``). An engine calls the stages (``tokenize.batches.ingest``, ``output.write``)
and never the run. ``local`` runs them in worker processes on this machine, ``ray`` on a Ray cluster.
"""

from __future__ import annotations

from typing import Any, Protocol, overload

from packcli.engines.jobs import (
    CacheParts,
    DigestChecker,
    HashJob,
    MadeParts,
    TokenizeJob,
    WholeStore,
    WriteJob,
)
from packcli.engines.local import LocalEngine
from packcli.errors import Opt, UsageError
from packcli.io.sources import InputSource
from packcli.results import FileDigest, ShardEntry
from packcli.store.tokens import TokenStore
from packcli.tokenize.options import TokenizeOptions

__all__ = [
    "CacheParts",
    "DigestChecker",
    "Engine",
    "FileHashing",
    "HashJob",
    "LocalEngine",
    "MadeParts",
    "TokenizeJob",
    "WholeStore",
    "WriteJob",
    "load_engine",
]


class FileHashing(Protocol):
    """An engine that reads the files elsewhere (not in this process) hashes them there (``Engine.hashing``)."""

    def hash_files(self, job: HashJob) -> dict[str, str]:
        """Return the content hashes (``io.fingerprint.file_blake2b``) of the job's files, by path."""
        ...

    def check_digests(self, directory: str, expected: dict[str, FileDigest]) -> None:
        """Check the sha256 of a found cache entry's token files (``expected``, by name, in ``directory``);
        raise ``DamagedStore`` as ``store.integrity.check_store`` does."""
        ...


class Engine(Protocol):
    """What an engine does for a run: how it cuts inputs into cache parts, tokenize, write, close; and
    two capabilities the run reads: where it hashes files, and whether it writes to an output URI."""

    @property
    def hashing(self) -> FileHashing | None:
        """Who hashes the inputs and a found cache entry's token files where the engine reads them; None:
        the run hashes the inputs (counting their records in the same read) and the store checks its files."""
        ...

    @property
    def uri_output(self) -> bool:
        """Whether the engine writes shards straight to a filesystem URI output (``s3://``...); the run
        then checks that output first and writes its manifest last (``io.uri``)."""
        ...

    def cache_part_cuts(self, options: TokenizeOptions, sources: list[InputSource]) -> list[list[Any] | None] | None:
        """How the engine cuts each input into cache parts (``CacheParts``): None, it makes none for this
        run (which makes one ``WholeStore``); or, for each input, None (parts of ``parts.PART_RECORDS``
        records, the local engine's) or the list of the engine's own cuts."""
        ...

    @overload
    def tokenize(self, job: WholeStore) -> TokenStore: ...

    @overload
    def tokenize(self, job: CacheParts) -> MadeParts: ...

    def tokenize(self, job: WholeStore | CacheParts) -> TokenStore | MadeParts:
        """Tokenize as the job says: a whole store (returned), or the cache parts the cache lacks."""
        ...

    def write(self, job: WriteJob) -> list[ShardEntry]:
        """Write the plan's rows as shards; return their manifest entries."""
        ...

    def close(self) -> None:
        """Release what the engine still holds when the run ends, however it ends."""
        ...


def load_engine(name: str, num_proc: int = 1, ray_address: str | None = None) -> Engine:
    """Return the engine ``name`` (--engine): local, or ray (which needs Ray installed)."""
    if name == "local":
        return LocalEngine(num_proc)
    try:
        from packcli.engines.ray.engine import RayEngine
    except ImportError as exc:
        raise UsageError(
            Opt("engine", "ray"), " needs Ray, which is not installed; pip install 'packcli[ray]'"
        ) from exc
    return RayEngine(ray_address, num_proc)
