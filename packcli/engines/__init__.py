"""Engines: where tokenizing and shard writing run. One small interface, one class per engine.

The run (``packcli.run.pipeline``) makes one engine per run (``load_engine``) and calls only the
methods of ``Engine``; an engine calls the stages (``tokenize.ingest``, ``output.write``) and never the
run. ``local`` runs them in worker processes on this machine, ``ray`` on a Ray cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from packcli.contract import Progress
from packcli.engines.local import LocalEngine
from packcli.errors import Opt, UsageError
from packcli.io.sources import InputSource
from packcli.output.layout import RowLayout
from packcli.plan.planner import Plan
from packcli.results import FileDigest, Manifest, ShardEntry
from packcli.store.parts import InputParts
from packcli.store.tokens import TokenStore
from packcli.tokenize.encoder import Encoder
from packcli.tokenize.options import TokenizeOptions

__all__ = ["DigestChecker", "Engine", "LocalEngine", "load_engine"]

# Checks a found cache entry's token files: (the entry's directory, its files' entries by name).
DigestChecker = Callable[[str, dict[str, FileDigest]], None]


class Engine(Protocol):
    """What an engine does for a run: hash and tokenize the inputs into a token store, write the planned rows."""

    def hash_files(self, sources: list[InputSource], memo: Path | None) -> dict[str, str] | None:
        """Return the content hashes of the inputs' files not remembered in ``memo``, by path, computed
        where the engine reads them; or None: the run hashes them itself (and counts their records)."""
        ...

    def rehash_files(self, sources: list[InputSource]) -> dict[str, str] | None:
        """Return the inputs' hashes again once they are read (did one change?); None: the run hashes them."""
        ...

    def digest_checker(self) -> DigestChecker | None:
        """Return what checks a found cache entry's token files; None: the token store checks them here."""
        ...

    def tokenize_to_store(
        self,
        options: TokenizeOptions,
        sources: list[InputSource],
        formats: dict[str, str | None],
        encoder: Encoder,
        store_path: Path,
        progress: Progress,
        rule_out_long: bool = False,
        before_finish: Callable[[dict[str, str]], None] | None = None,
    ) -> TokenStore:
        """Tokenize every record into a store at ``store_path`` (see ``ingest.tokenize_to_store``)."""
        ...

    def cache_part_cuts(self, options: TokenizeOptions, sources: list[InputSource]) -> list[list[Any] | None] | None:
        """How the engine cuts each input into cache parts (``tokenize_to_parts``): None, it makes none
        for this run (which makes one whole store); or, for each input, None (parts of
        ``parts.PART_RECORDS`` records, the local engine's) or the list of the engine's own cuts."""
        ...

    def tokenize_to_parts(
        self,
        options: TokenizeOptions,
        inputs: list[InputParts],
        formats: dict[str, str | None],
        encoder: Encoder,
        cache_root: Path,
        progress: Progress,
        rule_out_long: bool = False,
        unchanged: Callable[[InputSource], None] | None = None,
        hold: Callable[[str], None] | None = None,
        read_digests: dict[str, str] | None = None,
    ) -> dict[str, float]:
        """Tokenize what the cache lacks of each input into cache parts, committed as they are finished
        (see ``ingest.tokenize_to_parts``); return the seconds by stage. ``read_digests`` receives the
        hashes of the files the engine read through here, taken as it read them (by path), if it takes any."""
        ...

    def discard_store(self, store: TokenStore) -> None:
        """Remove what a store that is not kept left outside its directory (nothing, for most engines)."""
        ...

    def write_output(
        self, layout: RowLayout, store: TokenStore, plan: Plan, staged: Path | None, progress: Progress
    ) -> list[ShardEntry]:
        """Write the plan's rows as shards (into ``staged``, or to a URI output); return their entries."""
        ...

    def check_uri_output(self, output: str, overwrite: bool) -> None:
        """Refuse a filesystem-URI output that cannot be written (engines without URIs refuse them all)."""
        ...

    def write_manifest_uri(self, output: str, manifest: Manifest) -> None:
        """Write the manifest last at a filesystem-URI output, as the marker that the output is complete."""
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
