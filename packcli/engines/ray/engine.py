"""The Ray engine (``--engine ray``): reading, tokenizing and writing on a Ray cluster; the driver handles lengths.

The run (``packcli.run.pipeline``) calls a ``RayEngine`` as it calls the local engine, with the same
jobs (``packcli.engines.jobs``) and results:

- ``tokenize(WholeStore)``: parts of the inputs are read and tokenized by actors, and their tokens
  written as segments of the token store where the store is (``ray.tokenizing``); the driver runs the
  local engine's accounting loop on the samples' metadata.
- ``tokenize(CacheParts)``: the same, each part a cache part of its own, committed as it comes
  (``ray.cached``): a run that adds an input or resumes after a kill tokenizes only what the cache lacks.
- ``write``: the plan is made on the driver from the lengths alone; each shard is written by one
  call to a tokenizer actor of the run (warm: its imports are done), or on a cache hit by one Ray task
  (``ray.writing``), to a local directory or to a pyarrow filesystem URI (``s3://``, ``gs://``, ``file://``:
  ``uri_output``).
- ``hashing`` (``TaskHashing``): the inputs and a found cache entry's token files are hashed by tasks,
  where they are read, not on the driver.

No input byte and no token passes through the driver. What each node needs (see docs/ray.md): the
inputs at a URI or at the same path, and either storage for the output and token store that every
node mounts at the same path, or an output URI, where the token segments go too.

A run makes one engine; its state (the Ray session, the warm actors, the last run's figures) is on it.
Ray is imported at the top of the module on purpose: without it, importing this module fails and the
run tells the user how to install it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, overload

import ray

from packcli.contract import file_sha256
from packcli.engines.jobs import CacheParts, HashJob, MadeParts, WholeStore, WriteJob
from packcli.engines.ray import cached
from packcli.engines.ray.parts import input_cuts
from packcli.engines.ray.session import TASK_RETRIES, RaySession, cluster_cpus, kill, pickled
from packcli.engines.ray.tokenizing import ClusterTokenizing
from packcli.engines.ray.writing import write_shards
from packcli.io.fingerprint import file_blake2b
from packcli.io.sources import InputSource
from packcli.io.uri import is_uri
from packcli.results import FileDigest, ShardEntry
from packcli.store.integrity import DamagedStore
from packcli.store.tokens import TokenStore
from packcli.tokenize.batches import ingest
from packcli.tokenize.options import TokenizeOptions

T = TypeVar("T")


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def _hash_input(path: str) -> bytes:
    return pickled(file_blake2b(path))


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def _hash_token_file(path: str) -> bytes:
    return pickled(file_sha256(Path(path)))


class TaskHashing:
    """The Ray engine's ``hashing``: files hashed by tasks, one a file, where they are read (not on the driver)."""

    def __init__(self, session: RaySession) -> None:
        self.session = session

    def hash_files(self, job: HashJob) -> dict[str, str]:
        """The files' content hashes. Hashed again once read (``job.again``), by tasks that need no free
        CPU: the actors hold them all."""
        if not job.files:
            return {}
        self.session.ensure()
        task = _hash_input.options(num_cpus=0) if job.again else _hash_input
        refs = [task.remote(f) for f in job.files]
        return {f: self.session.fetch(ref) for f, ref in zip(job.files, refs, strict=True)}

    def check_digests(self, directory: str, expected: dict[str, FileDigest]) -> None:
        """Check the sha256 of a found cache entry's token files in tasks (the driver reads no token)."""
        self.session.ensure()
        refs = {name: _hash_token_file.remote(os.path.join(directory, name)) for name in expected}
        for name, ref in refs.items():
            if self.session.fetch(ref) != expected[name]["sha256"]:
                raise DamagedStore(f"{Path(directory) / name}: sha256 differs from meta.json (changed bytes)")


class RayEngine:
    """Ray actors tokenize, the driver plans from lengths, Ray actors or tasks write the shards (``--engine ray``).

    ``received`` counts what the driver fetched from the cluster (bytes, objects); ``last_run`` holds
    the figures of its last tokenizing: ``startup_seconds`` (until every actor had loaded its
    tokenizer), ``parts``, ``actors``, ``nodes`` (the Ray nodes the parts ran on) and, once the shards
    are written, ``shutdown_seconds``.
    """

    uri_output = True  # shards written in place at a filesystem URI, the manifest last (by the run)

    def __init__(self, address: str | None = None, num_cpus: int = 1) -> None:
        self.session = RaySession(address, num_cpus)
        self.hashing = TaskHashing(self.session)
        self.last_run: dict[str, Any] = {}
        self._warm: list[Any] = []  # the tokenizer actors of this run, kept to write its shards

    @property
    def received(self) -> dict[str, int]:
        return self.session.received

    def cache_part_cuts(self, options: TokenizeOptions, sources: list[InputSource]) -> list[list[Any] | None] | None:
        """Each input's cuts (``ray.parts.input_cuts``): its parts are cache parts. None for an output
        URI, where the tokens are written under the output, not in a cache every node mounts."""
        if is_uri(options.output):
            return None
        self.session.ensure()
        cpus = cluster_cpus()
        return [input_cuts(source, cpus) for source in sources]

    @overload
    def tokenize(self, job: WholeStore) -> TokenStore: ...

    @overload
    def tokenize(self, job: CacheParts) -> MadeParts: ...

    def tokenize(self, job: WholeStore | CacheParts) -> TokenStore | MadeParts:
        """Tokenize on Ray: every record of the sources into a token store at ``job.path`` (``WholeStore``),
        or the parts the cache lacks of each input, committed as they come (``CacheParts``, ``ray.cached``).

        The accounting (counts, rejects, ``--on-error fail``, the store's metadata) is the local
        engine's own loop; the reading, tokenizing and token writing run on the cluster, so no file is
        read here (``MadeParts.read_digests`` is empty). The early too-long rule (``rule_out_long``) needs
        the driver's renderer in every actor: this engine tokenizes every record.
        """
        if isinstance(job, WholeStore):
            return self._on_cluster(
                ClusterTokenizing(self.session, job.options, job.sources, job.formats, job.encoder, job.path),
                lambda remote: ingest.tokenize_to_store(
                    job.options, job.sources, job.formats, job.encoder, job.path, job.progress, remote=remote,
                    before_finish=job.before_finish,
                ),
            )  # fmt: skip
        sources = [item.source for item in job.inputs]
        seconds = self._on_cluster(
            ClusterTokenizing(self.session, job.options, sources, job.formats, job.encoder, job.cache_root),
            lambda remote: cached.tokenize_to_parts(
                remote, job.options, job.inputs, job.encoder, job.cache_root, job.progress, job.unchanged, job.hold
            ),
        )
        return MadeParts(seconds)

    def _on_cluster(self, remote: ClusterTokenizing, work: Callable[[ClusterTokenizing], T]) -> T:
        """Run ``work(remote)``, the run's tokenizing on the cluster; on failure stop everything it started."""
        began = time.perf_counter()
        self.last_run = {}
        self._release_actors()  # an earlier run's, never used for writing
        self.session.ensure()
        remote.began, remote.figures = began, self.last_run
        try:
            done = work(remote)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                remote.pending.clear()  # stopping on request: at once, not after the running parts
            remote.close()
            kill(remote.warm)
            remote.discard()
            self.session.shutdown_if_started_here()
            raise
        finally:
            remote.close()
        self._warm = remote.warm
        return done

    def write(self, job: WriteJob) -> list[ShardEntry]:
        """Write the planned rows as shards, one call per shard; return the manifest's shard entries.

        Shards go into ``job.directory`` (a local directory), or straight to ``job.layout.output`` when
        that is a filesystem URI (``s3://bucket/prefix``): there the run writes ``manifest.json`` last
        (``io.uri.write_manifest_uri``), as the marker that the output is complete.
        """
        actors, self._warm = self._warm, []
        try:
            return write_shards(self.session, job.layout, job.store, job.plan, job.directory, job.progress, actors)
        finally:
            t = time.perf_counter()
            self.session.shutdown_if_started_here()
            self.last_run["shutdown_seconds"] = time.perf_counter() - t

    def close(self) -> None:
        """Stop the actors still held, and the Ray instance this engine started (a dry run, a failed run)."""
        self._release_actors()
        self.session.shutdown_if_started_here()

    def _release_actors(self) -> None:
        kill(self._warm)
        self._warm = []
