"""Engines: where tokenizing and shard writing run. One small interface, one class per engine.

The run (``packcli.run.pipeline``) calls an engine; an engine calls the stages (``ingest``, ``plan``,
``write``, ``worker``) and never the run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from packcli.config import PackConfig
from packcli.contract import Progress
from packcli.errors import UsageError
from packcli.io.sources import InputSource
from packcli.plan.planner import Plan
from packcli.store.tokens import TokenStore
from packcli.tokenize.encoder import Encoder


class Engine(Protocol):
    """What an engine does: tokenize the inputs into a token store, and write the planned rows."""

    def tokenize_to_store(
        self,
        config: PackConfig,
        sources: list[InputSource],
        formats: dict[str, str | None],
        encoder: Encoder,
        store_path: Path,
        progress: Progress,
        rule_out_long: bool = False,
        before_finish: Callable[[], None] | None = None,
    ) -> TokenStore:
        """Tokenize every record into a store at ``store_path`` (see ``ingest.tokenize_to_store``)."""
        ...

    def write_output(
        self, config: PackConfig, store: TokenStore, plan: Plan, staged: Path | None, progress: Progress, pad_id: int
    ) -> list[dict[str, Any]]:
        """Write the plan's rows as shards (into ``staged``, or to a URI output); return their entries."""
        ...

    def check_uri_output(self, output: str, overwrite: bool) -> None:
        """Refuse a filesystem-URI output that cannot be written (engines without URIs refuse them all)."""
        ...

    def write_manifest_uri(self, output: str, manifest: dict[str, Any]) -> None:
        """Write the manifest last at a filesystem-URI output, as the marker that the output is complete."""
        ...


class LocalEngine:
    """Worker processes on this machine (``--num-proc``)."""

    def tokenize_to_store(
        self,
        config: PackConfig,
        sources: list[InputSource],
        formats: dict[str, str | None],
        encoder: Encoder,
        store_path: Path,
        progress: Progress,
        rule_out_long: bool = False,
        before_finish: Callable[[], None] | None = None,
    ) -> TokenStore:
        from packcli.tokenize.ingest import tokenize_to_store

        return tokenize_to_store(
            config,
            sources,
            formats,
            encoder,
            store_path,
            progress,
            rule_out_long=rule_out_long,
            before_finish=before_finish,
        )

    def write_output(
        self, config: PackConfig, store: TokenStore, plan: Plan, staged: Path | None, progress: Progress, pad_id: int
    ) -> list[dict[str, Any]]:
        from packcli.output.write import write_output

        assert staged is not None  # the local engine writes only to local paths, through a staging directory
        return write_output(config, store, plan, staged, progress, pad_id)

    def check_uri_output(self, output: str, overwrite: bool) -> None:
        raise UsageError(f"-o {output}: a filesystem URI output needs --engine ray; or pass a local path")

    def write_manifest_uri(self, output: str, manifest: dict[str, Any]) -> None:
        raise UsageError(f"-o {output}: a filesystem URI output needs --engine ray; or pass a local path")


def load_engine(config: PackConfig) -> Engine:
    """Return the engine ``config.engine`` names: local, or ray (which needs Ray installed)."""
    if config.engine == "local":
        return LocalEngine()
    try:
        from packcli.engines.ray.engine import RayEngine
    except ImportError as exc:
        raise UsageError("--engine ray needs Ray, which is not installed; pip install 'packcli[ray]'") from exc
    return RayEngine()
