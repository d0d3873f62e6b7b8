"""The local engine (the default): worker processes on this machine (``--num-proc``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from packcli.contract import Progress
from packcli.errors import UsageError
from packcli.io.sources import InputSource
from packcli.io.uri import needs_ray as _uri_output
from packcli.output.layout import RowLayout
from packcli.plan.planner import Plan
from packcli.results import FileDigest, Manifest, ShardEntry
from packcli.store.parts import InputParts
from packcli.store.tokens import TokenStore
from packcli.tokenize.encoder import Encoder
from packcli.tokenize.options import TokenizeOptions


class LocalEngine:
    """Worker processes on this machine: they tokenize the batches and write the shards (``--num-proc``).

    The run reads and hashes the inputs itself, and the token store checks its own files.
    """

    def __init__(self, num_proc: int = 1) -> None:
        self.num_proc = num_proc

    def hash_files(self, sources: list[InputSource], memo: Path | None) -> None:
        return None

    def rehash_files(self, sources: list[InputSource]) -> None:
        return None

    def digest_checker(self) -> Callable[[str, dict[str, FileDigest]], None] | None:
        return None

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
        from packcli.tokenize.ingest import tokenize_to_store

        return tokenize_to_store(
            options,
            sources,
            formats,
            encoder,
            store_path,
            progress,
            rule_out_long=rule_out_long,
            before_finish=before_finish,
        )

    def cache_part_cuts(self, options: TokenizeOptions, sources: list[InputSource]) -> list[list[Any] | None] | None:
        return [None] * len(sources)  # parts of PART_RECORDS records (packcli.store.parts)

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
        from packcli.tokenize.ingest import tokenize_to_parts

        return tokenize_to_parts(
            options, inputs, formats, encoder, cache_root, progress, rule_out_long, unchanged, hold, read_digests
        )

    def discard_store(self, store: TokenStore) -> None:
        return None  # its tokens are in its directory, which the run removes

    def write_output(
        self, layout: RowLayout, store: TokenStore, plan: Plan, staged: Path | None, progress: Progress
    ) -> list[ShardEntry]:
        from packcli.output.write import write_output

        if staged is None:  # the local engine writes only to local paths, through a staging directory
            raise UsageError(*_uri_output(layout.output))
        return write_output(layout, store, plan, staged, progress, self.num_proc)

    def check_uri_output(self, output: str, overwrite: bool) -> None:
        raise UsageError(*_uri_output(output))

    def write_manifest_uri(self, output: str, manifest: Manifest) -> None:
        raise UsageError(*_uri_output(output))

    def close(self) -> None:
        return None
