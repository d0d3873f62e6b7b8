"""The local engine (the default): worker processes on this machine (``--num-proc``)."""

from __future__ import annotations

from typing import Any, overload

from packcli.engines.jobs import CacheParts, MadeParts, WholeStore, WriteJob
from packcli.errors import UsageError
from packcli.io.sources import InputSource
from packcli.io.uri import needs_ray as _uri_output
from packcli.results import ShardEntry
from packcli.store.tokens import TokenStore
from packcli.tokenize.options import TokenizeOptions


class LocalEngine:
    """Worker processes on this machine: they tokenize the batches and write the shards (``--num-proc``).

    The run reads and hashes the inputs itself (``hashing`` None), the token store checks its own
    files, and shards are written to local paths only (``uri_output`` False).
    """

    hashing: None = None
    uri_output = False

    def __init__(self, num_proc: int = 1) -> None:
        self.num_proc = num_proc

    def cache_part_cuts(self, options: TokenizeOptions, sources: list[InputSource]) -> list[list[Any] | None] | None:
        return [None] * len(sources)  # parts of PART_RECORDS records (packcli.store.parts)

    @overload
    def tokenize(self, job: WholeStore) -> TokenStore: ...

    @overload
    def tokenize(self, job: CacheParts) -> MadeParts: ...

    def tokenize(self, job: WholeStore | CacheParts) -> TokenStore | MadeParts:
        from packcli.tokenize.batches import ingest

        if isinstance(job, WholeStore):
            return ingest.tokenize_to_store(
                job.options,
                job.sources,
                job.formats,
                job.encoder,
                job.path,
                job.progress,
                rule_out_long=job.rule_out_long,
                before_finish=job.before_finish,
            )
        read: dict[str, str] = {}  # the hashes of the files read through, taken as they were read
        seconds = ingest.tokenize_to_parts(
            job.options, job.inputs, job.formats, job.encoder, job.cache_root, job.progress, job.rule_out_long,
            job.unchanged, job.hold, read,
        )  # fmt: skip
        return MadeParts(seconds, read)

    def write(self, job: WriteJob) -> list[ShardEntry]:
        from packcli.output.write import write_output

        if job.directory is None:  # the local engine writes only to local paths, through a staging directory
            raise UsageError(*_uri_output(job.layout.output))
        return write_output(job.layout, job.store, job.plan, job.directory, job.progress, self.num_proc)

    def close(self) -> None:
        return None
