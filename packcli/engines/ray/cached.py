"""The Ray engine's cache parts: each of its parts of an input (a byte range of JSON lines, a range of
Parquet row groups, or a whole source) is a cache part (``packcli.store.parts``).

An input is cut by its own size alone (``ray.parts.input_cuts``), and each cut is in its part's key, so a
run that adds an input, swaps a --mix source or resumes after a kill finds the parts it shares with an
earlier run. The actors write each part's tokens into that part's own directory in the cache (the
directory every node mounts, as the token store's); the driver takes the parts' results in input order,
numbers their records from the input's first, and commits each part as it comes, as the local engine
does. A part's meta.json also records the lines (or records) its reading passed, which the line numbers
of the parts after it add, when those are made by a later run.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from packcli.contract import Progress
from packcli.engines.ray.parts import Part, cut_parts, empty_source_error
from packcli.engines.ray.tokenizing import ClusterTokenizing
from packcli.io.sources import InputSource
from packcli.store import parts
from packcli.tokenize.batches import ingest
from packcli.tokenize.batches.building import StoreBuilder
from packcli.tokenize.encoders.encoder import Encoder
from packcli.tokenize.options import CACHE_FIX, TokenizeOptions


def tokenize_to_parts(
    remote: ClusterTokenizing,
    options: TokenizeOptions,
    inputs: list[parts.InputParts],
    encoder: Encoder,
    cache_root: Path,
    progress: Progress,
    unchanged: Callable[[InputSource], None] | None = None,
    hold: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Tokenize on the cluster the parts the cache lacks of each input (``inputs[k].cuts``), committing
    each as its result comes, in input order; ``inputs[k].made`` receives them. Return the seconds by stage."""
    formats = remote.formats
    jobs: list[Part] = []
    owner: list[tuple[parts.InputParts, int]] = []  # each job's input and part number
    for item in inputs:
        if item.complete:
            continue
        assert item.cuts is not None
        todo = cut_parts(item.source, formats[item.source.display], item.cuts, item.next_index, len(jobs))
        jobs.extend(todo)
        owner.extend((item, item.next_index + k) for k in range(len(todo)))
    clock: defaultdict[str, float] = defaultdict(float)
    began = time.perf_counter()
    builders: dict[int, StoreBuilder] = {}

    def prepare(part: Part) -> Part:
        """A part about to be submitted: held, and given its directory (a part of the cache being made)."""
        item, number = owner[part.number]
        if hold is not None:
            hold(item.key_of(number))
        builder = StoreBuilder(options, cache_root / item.key_of(number), cache_root, CACHE_FIX)
        builders[part.number] = builder
        return dataclasses.replace(part, directory=str(builder.tmp.resolve()))

    identity, pad_id = ingest.store_identity(encoder), ingest.store_pad_id(encoder)
    try:
        for part, out in remote.outputs(jobs, str(cache_root.resolve()), prepare):
            item, number = owner[part.number]
            builder = builders[part.number]
            first, units = item.next_record, item.next_unit
            stored = time.perf_counter()
            if out["n_records"]:
                builder.take(remote.numbered(part, out, first, units))
            for key, value in out["seconds"].items():
                clock[key] += value
            if out["error"] is not None:
                raise out["error"]
            if part.last_of_source and part.kind != "whole" and first + out["n_records"] == 0:
                raise empty_source_error(part.source)
            if unchanged is not None:
                unchanged(item.source)
            meta = builder.meta([item.source], formats, identity, pad_id, encoder.choice.record())
            where = parts.part_meta(number, first, out["n_records"], part.last_of_source, out["units"])
            meta = dataclasses.replace(meta, part=where)
            item.made.append(builder.finish(meta, verify=False))  # the actor hashed its tokens as it wrote them
            del builders[part.number]
            clock["store"] += time.perf_counter() - stored
            progress("tokenize", out["n_records"], None)
        clock["wall"] = time.perf_counter() - began
        return dict(clock)
    finally:
        for builder in builders.values():  # begun, not committed: a failed or stopped run
            builder.abort()
