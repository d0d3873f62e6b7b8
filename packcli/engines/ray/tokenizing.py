"""The Ray engine's tokenizing: parts of the inputs read and tokenized by actors; the tokens stay there.

The inputs are cut into parts (JSON lines by byte range, Parquet by row group, other sources whole:
``ray.parts``). A pool of tokenizer actors, one per CPU of the cluster, each loading the tokenizer once,
reads its parts itself, tokenizes them with the local engine's per-batch function, and writes each
part's tokens as one *segment* of the token store, where the store is (the store's directory, or under
the output URI ``.../.packcli-tokens/``). The driver receives per part only the samples' metadata
(relative index, length, trained count, first trained position, position, piece, role: 20 bytes a
sample, 24 when records are split), the rejects and the segment's checksums; it numbers the parts'
records (prefix sums of their counts) and runs the local engine's accounting loop (``ingest``), so
counts, rejects, errors and the store's arrays are the local ones.

The actor is ``actors``' (``Tokenizer``, with its ``TokenizerSettings`` and ``SegmentWriter``, re-exported
here); this module is the driver's side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray

import packcli.engines.ray.parts as ray_parts
from packcli.engines.ray.actors import (
    ZERO_COUNTERS as ZERO_COUNTERS,
    SegmentWriter as SegmentWriter,
    Tokenizer as Tokenizer,
    TokenizerSettings as TokenizerSettings,
)
from packcli.engines.ray.session import (
    ACTOR_RESTARTS,
    TASK_RETRIES,
    RaySession,
    cluster_cpus,
    kill,
    pickled,
    worker_error,
)
from packcli.io.sources import InputSource
from packcli.io.uri import is_uri, remove_uri_dir
from packcli.owned import owner_tag
from packcli.procs.stop import raise_if_stopped
from packcli.tokenize.batches import ingest
from packcli.tokenize.batches.worker import TokenizedBatch
from packcli.tokenize.encoders.encoder import Encoder
from packcli.tokenize.options import TokenizeOptions

STOP_WAIT = 10.0  # seconds a failed run waits for its running parts before it kills their actors


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def _count_part(part: ray_parts.Part) -> bytes:
    return pickled(ray_parts.count_part(part))


class ClusterTokenizing:
    """The ``remote`` of ``ingest.tokenize_to_store``: parts tokenized by actors, results in input order."""

    def __init__(
        self, session: RaySession, options: TokenizeOptions, sources: list[InputSource], formats: dict[str, str | None],
        encoder: Encoder, store_path: Path,
    ) -> None:  # fmt: skip
        self.session = session
        self.options, self.sources, self.formats, self.encoder = options, sources, formats, encoder
        self.segment_root: str | None = None  # None: the segments are written into the store's directory
        if is_uri(options.output) and not options.dry_run:
            # The output's file system holds the tokens too: no node needs to see the driver's disk.
            name = store_path.name if options.cache else f"tokens-{owner_tag()}-{uuid.uuid4().hex[:8]}"
            self.segment_root = f"{options.output.rstrip('/')}/.packcli-tokens/{name}"
        self.actors: list[Any] = []
        self.pending: dict[Any, tuple[int, int]] = {}  # parts submitted, not yet fetched
        self.running: Any = None
        self.began = time.perf_counter()
        # Seconds until every actor had loaded its tokenizer (start-up), parts, actors, and the Ray nodes
        # the parts ran on (``RayEngine.last_run``).
        self.figures: dict[str, Any] = {}
        self.warm: list[Any] = []  # the actors, once every part is in: they write the shards next

    def settings(self, root: str) -> TokenizerSettings:
        options = self.options
        return TokenizerSettings(
            root=root,
            tokenizer=_absolute_if_local(options.tokenizer),
            chat_template=_absolute_if_local(options.chat_template),
            options=options.encode,
            fields=dict(options.fields),
            split=options.split,
            fix_turns=options.fix_turns,
            identity=self.encoder.identity(),
            batch_size=ingest.BATCH_SIZE,
            long_text_bytes=ingest.long_text_bytes(options, self.encoder),
            encoder=options.encoder,
        )

    def parts(self) -> list[ray_parts.Part]:
        parts = ray_parts.make_parts(self.sources, self.formats, ray_parts.part_bytes(self.sources, cluster_cpus()))
        if self.options.limit is None:
            return parts
        # --limit N: the first N records over all sources. A first pass counts each part's records, so
        # that each part knows how many it reads; the parts after the N-th record are not read at all.
        counts = [self.session.fetch(ref) for ref in [_count_part.remote(p) for p in parts]]
        limited, left = [], self.options.limit
        for part, count in zip(parts, counts, strict=True):
            if left <= 0:
                break
            limited.append(dataclasses.replace(part, max_records=left))
            left -= count
        return limited

    def results(self, directory: Path | None) -> Iterator[TokenizedBatch]:
        self.running = self._results(directory)
        return self.running

    def close(self) -> None:
        """Stop now, however the run ended: the pending parts are cancelled and the actors stopped."""
        if self.running is not None:
            self.running.close()
        self.stop()

    def _results(self, directory: Path | None) -> Iterator[TokenizedBatch]:
        root = self.segment_root or str(Path(directory).resolve())  # type: ignore[arg-type]
        index = 0  # records of the parts before (sample_index of the next part's first record)
        unit_base = 0  # lines or records of this source's parts before
        source_records = 0
        for part, out in self.outputs(self.parts(), root):
            if out["n_records"]:
                yield self.numbered(part, out, index, unit_base)
            index += out["n_records"]
            source_records += out["n_records"]
            unit_base += out["units"]
            if out["error"] is not None:
                raise out["error"]
            if part.last_of_source:
                if part.kind != "whole" and source_records == 0 and part.max_records != 0:
                    raise ray_parts.empty_source_error(part.source)
                unit_base = source_records = 0

    def outputs(
        self, parts: list[ray_parts.Part], root: str, prepare: Callable[[ray_parts.Part], ray_parts.Part] | None = None
    ) -> Iterator[tuple[ray_parts.Part, dict[str, Any]]]:
        """Run the parts on a pool of tokenizer actors writing under ``root``; yield each part and its
        result, in order. ``prepare(part)`` runs as a part is submitted (and may give it a directory).

        Once every part is in, the actors are kept, warm, to write the shards (``warm``).
        """
        n_actors = max(1, min(cluster_cpus(), len(parts)))
        actor = ray.remote(num_cpus=1, max_restarts=ACTOR_RESTARTS, max_task_retries=TASK_RETRIES)(Tokenizer)
        settings = self.settings(root)
        self.actors = [actor.remote(settings) for _ in range(n_actors)]
        # Start-up ends when every actor has loaded its tokenizer: the cluster's fixed cost, apart.
        for ref in [a.ready.remote() for a in self.actors]:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise worker_error(exc) from exc
        ready_at = time.perf_counter()
        self.figures.update(startup_seconds=ready_at - self.began, ready_at=ready_at, parts=len(parts), actors=n_actors)
        nodes: set[str] = set()
        self.figures["nodes"] = nodes
        window = 2 * n_actors  # parts in flight (or done, waiting for the parts before them)
        pending: dict[Any, tuple[int, int]] = self.pending
        done: dict[int, dict[str, Any]] = {}
        load = [0] * n_actors
        submitted = 0
        try:
            for k, part in enumerate(parts):
                while submitted < len(parts) and submitted < k + window:
                    a = load.index(min(load))
                    job = parts[submitted] if prepare is None else prepare(parts[submitted])
                    pending[self.actors[a].run.remote(job)] = (submitted, a)
                    load[a] += 1
                    submitted += 1
                while k not in done:
                    raise_if_stopped()
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
                    for ref in ready:
                        i, a = pending.pop(ref)
                        load[a] -= 1
                        done[i] = self.session.fetch(ref)
                out = done.pop(k)
                nodes.add(out.pop("node"))
                yield part, out
            # Every part is in: the actors, warm (imports done), write the shards next (``RayEngine.write``).
            self.warm, self.actors = self.actors, []
        finally:
            self.stop()  # parts still pending die with their actors

    def numbered(self, part: ray_parts.Part, out: dict[str, Any], index: int, unit_base: int) -> TokenizedBatch:
        arrays = out["arrays"]
        for entry in (*out["rejects"], *out["turn_fixes"]):
            entry["sample_index"] += index
            entry["position"] += unit_base
        return TokenizedBatch(
            source=part.source.display,
            unit=out["unit"],
            first_index=index,
            n_records=out["n_records"],
            ids=np.zeros(0, np.int32),  # the tokens are in the segment, on the cluster
            labels=np.zeros(0, np.int32),
            sample_index=arrays["index"].astype(np.int64) + index,
            lengths=arrays["lengths"],
            trainable=arrays["trainable"],
            first_trained=arrays["first"],
            positions=arrays["pos"] + np.int32(unit_base),
            piece_index=arrays["piece"],
            roles=arrays["role"],
            rejects=out["rejects"],
            records_split=out.get("records_split", 0),
            pieces_made=out.get("pieces_made", 0),
            pieces_left_out=out["pieces_left_out"],
            turns_fixed=out["turns_fixed"],
            turn_fixes=out["turn_fixes"],
            empty_answers=out.get("empty_answers", 0),
            leading_answers=out.get("leading_answers", 0),
            tools_left_out=out.get("tools_left_out", 0),
            slow_records=out.get("slow_records", 0),
            reasoning=out["reasoning"],
            tokens_left_out=out["tokens_left_out"],
            seconds=out["seconds"],
            segment=out["segment"],
            segment_files=out["files"],
        )

    def stop(self) -> None:
        """Stop the actors (they give their CPUs back, to the next run or to other jobs).

        Parts still queued are cancelled and the running ones (a part takes seconds) are let finish
        first, for at most STOP_WAIT seconds: an actor killed with calls in flight has Ray's driver print
        on standard output that it will retry them.
        """
        if self.pending and self.actors:
            refs = list(self.pending)
            for ref in refs:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT)
        self.pending.clear()
        kill(self.actors)
        self.actors = []

    def discard(self) -> None:
        """Remove segments written under the output URI (a failed run, or a store that is not kept)."""
        if self.segment_root is not None:
            remove_uri_dir(self.segment_root)


def _absolute_if_local(path: str | None) -> str | None:
    """Tokenizer directories and template files as absolute paths: actors may run in another directory."""
    if path is not None and os.path.exists(os.path.expanduser(path)):
        return os.path.abspath(os.path.expanduser(path))
    return path
