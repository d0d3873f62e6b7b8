"""``verify --reencode N``: N rows of a packed output encoded again from the inputs, by ``tokenizers``.

Whichever encoder made the output (``packcli.tokenize.encoders.text_encoders``), the rows must hold what the
reference encoder gives. The rows are chosen evenly over the output; their samples' records are read
again from the inputs the manifest names (unchanged: their content hashes must match), tokenized by the
same worker code with ``--encoder tokenizers``, and each sample's ids and labels compared with its
segment in the row. A sample cut by ``--overflow truncate`` (or split's fallback) is compared on the
ids it kept. Outputs this cannot redo are said so, not failed: preference and KTO data, images,
``--mix`` and an eval split (their rows do not map to records this simply).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packcli.contract import IGNORE_INDEX
from packcli.errors import Message, Opt, PackcliError, first_line
from packcli.jsontypes import JSONObject


@dataclass
class Reencoded:
    """What ``verify --reencode`` compared: rows, samples, and the samples that differ (each named)."""

    rows: int = 0
    samples: int = 0
    differ: list[tuple[str, str]] = field(default_factory=list)  # (shard file, what differs)
    skipped: str | Message | None = None  # why no row could be compared (the output or its inputs), or None

    def to_dict(self) -> JSONObject:
        """The comparison as a dict; ``skipped`` stays a Message when it names an option (see VerifyReport.to_dict)."""
        return {**dataclasses.asdict(dataclasses.replace(self, skipped=None)), "skipped": self.skipped}


def reencode_rows(directory: Path, manifest: JSONObject, n_rows: int) -> Reencoded:
    """Encode ``n_rows`` rows of the output again with ``tokenizers`` and compare; return what was found."""
    from packcli.io.fingerprint import fingerprint
    from packcli.io.sources import resolve_inputs

    done = Reencoded()
    options = dict(manifest.get("options") or {})
    why = _cannot_redo(manifest, options)
    if why is not None:
        done.skipped = why
        return done
    try:
        config = _config(options, [str(i["path"]) for i in manifest["inputs"]])
        sources = resolve_inputs(list(config.inputs), config.split)
        changed = [
            s.display
            for s, i in zip(sources, manifest["inputs"], strict=False)
            if fingerprint(s, None) != i.get("blake2b")
        ]
    except (PackcliError, OSError, TypeError, ValueError) as exc:
        cause = exc.parts if isinstance(exc, PackcliError) else (first_line(exc),)  # its options named by the reader
        done.skipped = Message("the inputs cannot be read again (", *cause, ")")
        return done
    if changed or len(sources) != len(manifest["inputs"]):
        done.skipped = f"the inputs changed since the output was made ({', '.join(changed) or 'their number'})"
        return done
    wanted = _wanted_segments(directory, manifest, n_rows)
    done.rows = len({(file, row) for file, row, _ in wanted.values()})
    formats = {str(i["path"]): i.get("format") for i in manifest["inputs"]}
    for (index, piece), got, want in _reference_samples(config, sources, formats, wanted):
        done.samples += 1
        if not _same(got, want, config.cut_side):
            file, row, _ = wanted[(index, piece)]
            what = f"row {row}: sample {index} (piece {piece}) differs from its encoding by tokenizers"
            done.differ.append((file, what))
    return done


def _cannot_redo(manifest: JSONObject, options: JSONObject) -> str | Message | None:
    if str(manifest.get("task") or "sft") != "sft":
        return "preference and KTO outputs are not re-encoded"
    if options.get("processor") or options.get("mix") or manifest.get("eval"):
        return Message("outputs with images, ", Opt("mix"), " or an eval split are not re-encoded")
    if not isinstance(manifest.get("inputs"), list) or not manifest["inputs"]:
        return "the manifest names no inputs"
    return None


def _config(options: JSONObject, inputs: list[str]) -> Any:
    """The run's PackConfig, from the manifest's options (the inputs as the manifest names them)."""
    from dataclasses import fields

    from packcli.config import PackConfig

    names = {f.name for f in fields(PackConfig)} - {"inputs", "output", "mix"}
    kept = {k: v for k, v in options.items() if k in names}
    return PackConfig(inputs=tuple(inputs), **kept)


def _wanted_segments(
    directory: Path, manifest: JSONObject, n_rows: int
) -> dict[tuple[int, int], tuple[str, int, dict[str, np.ndarray]]]:
    """Each sample of the chosen rows, by (sample_index, piece_index): its shard, its row and its segment."""
    from packcli.report.inspect import locate_row, read_row
    from packcli.results import Manifest

    typed = Manifest.from_dict(manifest)
    total = sum(entry.rows for entry in typed.shards)
    chosen = sorted({int(r) for r in np.linspace(0, total - 1, min(n_rows, total))}) if total else []
    wanted: dict[tuple[int, int], tuple[str, int, dict[str, np.ndarray]]] = {}
    for row in chosen:
        file, in_shard = locate_row(typed, row)
        data = read_row(directory / file, in_shard)
        ids, labels = np.asarray(data["input_ids"]), np.asarray(data["labels"])
        pieces = data.get("piece_index") or [0] * len(data["sample_index"])
        start = 0
        for length, index, piece in zip(data["seq_lengths"], data["sample_index"], pieces, strict=True):
            end = start + int(length)
            if int(index) >= 0:  # not a padding segment
                segment = {"ids": ids[start:end], "labels": labels[start:end]}
                wanted[(int(index), int(piece))] = (file, row, segment)
            start = end
    return wanted


def _reference_samples(
    config: Any, sources: list[Any], formats: dict[str, Any], wanted: dict[tuple[int, int], Any]
) -> Any:
    """Yield ((sample_index, piece_index), the row's segment, tokenizers' (ids, labels)) for each wanted sample."""
    from packcli.io.readers import read_batches
    from packcli.run.options import encode_options, split_rule
    from packcli.tokenize.batches import ingest, worker
    from packcli.tokenize.encoders.encoder import Encoder

    if not wanted:
        return
    encoder = Encoder(config.tokenizer_name, config.chat_template, encode_options(config), encoder="tokenizers")
    indices = np.array(sorted({index for index, _ in wanted}), dtype=np.int64)
    context = worker.WorkerContext(
        encoder,
        dict(config.fields),
        split=split_rule(config),
        fix_turns=config.fix_turns,
        expand_turns=config.expand_turns,
        prefix_tree=config.max_len if config.prefix_tree else None,
    )
    for batch in read_batches(sources, ingest.BATCH_SIZE, config.limit):
        lo, hi = batch.first_index, batch.first_index + len(batch.items)
        if not np.any((indices >= lo) & (indices < hi)):
            continue
        result = worker.tokenize_batch(context, batch, formats.get(batch.source))
        starts = np.zeros(len(result.lengths) + 1, dtype=np.int64)
        np.cumsum(result.lengths, out=starts[1:])
        pieces = result.piece_index if result.piece_index is not None else np.zeros(len(result.lengths), int)
        for k, (index, piece) in enumerate(zip(result.sample_index.tolist(), pieces.tolist(), strict=True)):
            if (index, piece) in wanted:
                span = slice(starts[k], starts[k + 1])
                yield (index, piece), wanted[(index, piece)][2], (result.ids[span], result.labels[span])
        if batch.first_index + len(batch.items) > indices[-1]:
            break


def _same(segment: dict[str, np.ndarray], reference: tuple[np.ndarray, np.ndarray], cut_side: str) -> bool:
    """Whether a row's segment holds the reference's ids and labels (the kept side of a cut sample's ids)."""
    ids, labels = segment["ids"], segment["labels"]
    ref_ids, ref_labels = reference
    n = len(ids)
    if n == len(ref_ids):
        return bool(np.array_equal(ids, ref_ids) and np.array_equal(labels, ref_labels))
    if n > len(ref_ids):
        # Alignment padding (--pad-to-multiple-of) after the sample: masked, and the sample before it whole.
        tail_masked = bool(np.all(labels[len(ref_ids) :] == IGNORE_INDEX))
        return tail_masked and _same({"ids": ids[: len(ref_ids)], "labels": labels[: len(ref_ids)]}, reference, "")
    kept = ref_ids[-n:] if cut_side == "left" else ref_ids[:n]
    return bool(np.array_equal(ids, kept))
