"""The Ray engine's tokenizer actor: it loads the tokenizer and template once, then reads parts of the
inputs, tokenizes them with the local engine's per-batch function and writes each part's tokens as one
segment of the token store (``SegmentWriter``); the driver gets back the part's metadata only.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np
import ray

import packcli.engines.ray.parts as ray_parts
from packcli.engines.ray.session import RayEngineError, pickled
from packcli.engines.ray.writing import shard_job
from packcli.errors import Opt, PackcliError
from packcli.io.uri import is_uri, join
from packcli.results import FileDigest, Segment, TokenizerIdentity
from packcli.store.integrity import Digest, segment_files
from packcli.tokenize.batches import worker
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder
from packcli.tokenize.long.split import SplitRule

# A part's counters the task leaves out of its result when they are 0.
ZERO_COUNTERS = ("records_split", "pieces_made", "empty_answers", "leading_answers", "tools_left_out", "slow_records")


class SegmentWriter:
    """Writes one part's tokens as a segment (two files) under a root that is a local path or a URI.

    The sha256 and size of each file are measured as it is written, for the store's meta.json.
    """

    def __init__(self, root: str, prefix: str) -> None:
        self.root, self.prefix = root, prefix
        self.names = segment_files(prefix)
        self.digests = (Digest(), Digest())
        self.tokens = 0
        self._files: list[Any] = []

    def write(self, ids: np.ndarray, labels: np.ndarray) -> None:
        if not len(ids):
            return
        if not self._files:
            self._files = [self._open(name) for name in self.names]
        for fh, digest, array in zip(self._files, self.digests, (ids, labels), strict=True):
            data = np.ascontiguousarray(array, dtype="<i4").tobytes()
            fh.write(data)
            digest.update(data)
        self.tokens += len(ids)

    def _open(self, name: str) -> Any:
        path = join(self.root, name)
        if is_uri(self.root):
            from pyarrow import fs as pafs

            filesystem, where = pafs.FileSystem.from_uri(path)
            filesystem.create_dir(where.rsplit("/", 1)[0], recursive=True)  # file:// needs it; S3 and GCS do not
            return filesystem.open_output_stream(where)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "wb")

    def close(self) -> tuple[Segment | None, dict[str, FileDigest]]:
        """Close the files; return the segment (None when the part kept no sample) and its files' entries."""
        for fh in self._files:
            fh.close()
        if not self.tokens:
            return None, {}
        entries = {name: digest.entry() for name, digest in zip(self.names, self.digests, strict=True)}
        return {"prefix": self.prefix, "tokens": self.tokens}, entries


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
    """What every tokenizer actor of a run is made with (the run's options it needs, not the whole config)."""

    root: str  # where the token segments go: the store's directory, or under the output URI
    tokenizer: str | None  # as the driver names it (a local directory made absolute)
    chat_template: str | None
    options: EncodeOptions
    fields: dict[str, str]
    split: SplitRule | None
    fix_turns: bool
    identity: TokenizerIdentity  # the driver's tokenizer identity, which every actor's must equal
    batch_size: int
    long_text_bytes: int | None
    encoder: str = "auto"  # --encoder (packcli.tokenize.encoders.text_encoders)


class Tokenizer:
    """A tokenizer actor: loads the tokenizer and template once, then reads and tokenizes parts."""

    def __init__(self, settings: TokenizerSettings) -> None:
        # One tokenizer thread per actor: the actors are the parallelism, as the local engine's processes are.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        root = settings.root
        if not is_uri(root) and not os.path.isdir(root):
            raise RayEngineError(
                f"the token store {root} is not visible on Ray node {ray.util.get_node_ip_address()}",
                hint=(
                    "put ",
                    Opt("cache_dir"),
                    " and the output on storage every node mounts at the same path, or write to an output URI (",
                    Opt("output", "s3://bucket/prefix", short=True),
                    "), where the tokens go too",
                ),
            )
        encoder = Encoder(settings.tokenizer, settings.chat_template, settings.options, encoder=settings.encoder)
        own, expected = encoder.identity(), settings.identity
        if (own["sha256"], own["chat_template_sha256"]) != (expected["sha256"], expected["chat_template_sha256"]):
            raise RayEngineError(
                f"the tokenizer or chat template on Ray node {ray.util.get_node_ip_address()} differs from the "
                "driver's; install the same tokenizer files on every node (or pass a Hub name)"
            )
        self.context = worker.WorkerContext(
            encoder, settings.fields, split=settings.split, fix_turns=settings.fix_turns
        )
        encoder.long_text_bytes = settings.long_text_bytes
        self.root = root
        self.batch_size = settings.batch_size

    def ready(self) -> bool:
        return True

    def write_shard(self, *args: Any) -> bytes:
        """Write one shard (see ``writing.shard_job``) once the parts are done: the actor is already warm."""
        return pickled(shard_job(*args))

    def run(self, part: ray_parts.Part) -> bytes:
        """Read and tokenize one part, write its tokens as a segment; return its metadata, pickled.

        A problem with the data (a read error, a packcli error while tokenizing) is returned, after
        the batches before it, for the driver to raise in input order; anything else fails the call.
        """
        began, cpu_began = time.perf_counter(), time.process_time()
        segment = SegmentWriter(part.directory or self.root, f"segments/{part.number:06d}-")
        units = ray_parts.Units()
        keys = ("index", "lengths", "trainable", "first", "pos", "piece", "role")
        arrays: dict[str, list[np.ndarray]] = {k: [] for k in keys}
        out: dict[str, Any] = {
            "rejects": [],
            "n_records": 0,
            "records_split": 0,
            "pieces_made": 0,
            "turn_fixes": [],
            "empty_answers": 0,
            "leading_answers": 0,
            "tools_left_out": 0,
            "slow_records": 0,
        }
        fixed: dict[str, int] = {}
        reasoning: dict[str, int] = {}
        left_out: dict[str, int] = {}
        left_out_tokens: dict[str, int] = {}
        seconds: dict[str, float] = {"decode": 0.0, "tokenize": 0.0}
        unit, split, roles = "record", False, False
        error: PackcliError | None = None
        read = 0.0
        try:
            batches = ray_parts.read_part(part, self.batch_size, units)
            while True:
                t = time.perf_counter()
                batch = next(batches, None)
                read += time.perf_counter() - t
                if batch is None:
                    break
                result = worker.tokenize_batch(self.context, batch, part.fmt)
                segment.write(result.ids, result.labels)
                unit = result.unit
                out["n_records"] += result.n_records
                out["records_split"] += result.records_split
                out["pieces_made"] += result.pieces_made
                out["rejects"].extend(result.rejects)
                out["turn_fixes"].extend(result.turn_fixes)
                out["empty_answers"] += result.empty_answers
                out["leading_answers"] += result.leading_answers
                out["tools_left_out"] += result.tools_left_out
                out["slow_records"] += result.slow_records
                for key, n in result.reasoning.items():
                    reasoning[key] = reasoning.get(key, 0) + n
                for kind, n in result.turns_fixed.items():
                    fixed[kind] = fixed.get(kind, 0) + n
                for reason, n in result.pieces_left_out.items():
                    left_out[reason] = left_out.get(reason, 0) + n
                for reason, n in result.tokens_left_out.items():
                    left_out_tokens[reason] = left_out_tokens.get(reason, 0) + n
                for key in ("decode", "tokenize"):
                    seconds[key] += result.seconds.get(key, 0.0)
                split = split or result.piece_index is not None
                roles = roles or result.roles is not None
                n = len(result.lengths)
                arrays["index"].append(result.sample_index.astype(np.int32))
                arrays["lengths"].append(result.lengths)
                arrays["trainable"].append(result.trainable)
                arrays["first"].append(result.first_trained)
                arrays["pos"].append(result.positions)
                arrays["piece"].append(
                    np.zeros(n, np.int32) if result.piece_index is None else result.piece_index.astype(np.int32)
                )
                arrays["role"].append(np.zeros(n, np.int8) if result.roles is None else result.roles.astype(np.int8))
        except PackcliError as exc:
            error = exc
        seg, files = segment.close()
        joined = {k: np.concatenate(v) if v else np.zeros(0, np.int32) for k, v in arrays.items()}
        if not split:
            joined["piece"] = None  # type: ignore[assignment]  # all 0: not sent
        if not roles:
            joined["role"] = None  # type: ignore[assignment]  # not preference data: not sent
        seconds["read"] = read
        seconds["cpu"] = time.process_time() - cpu_began
        seconds["wall"] = time.perf_counter() - began
        out.update(
            arrays=joined,
            unit=unit,
            units=units.value,
            pieces_left_out=left_out,
            turns_fixed=fixed,
            reasoning=reasoning,
            tokens_left_out=left_out_tokens,
            seconds=seconds,
            segment=seg,
            files=files,
            error=error,
            node=ray.get_runtime_context().get_node_id(),
        )
        # Counters that stayed 0 are not sent (the driver reads them as 0): what the driver receives is
        # metadata, kept small.
        return pickled({k: v for k, v in out.items() if not (k in ZERO_COUNTERS and v == 0)})
