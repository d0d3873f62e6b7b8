"""Figures about packed rows (from an output directory) or about raw input before packing (a what-if).

Both read sample lengths only: a packed output shard by shard and a batch of rows at a time, a raw
input through the same reading, formatting and tokenization as ``packcli pack`` (and the same
tokenization cache, so a later ``pack`` of the same input reuses it). Nothing here prints; the
functions return plain dictionaries that the CLI renders or dumps as JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packcli.config import option_problem
from packcli.contract import IGNORE_INDEX, MANIFEST
from packcli.errors import OutputError, UsageError, first_line
from packcli.output.formats import shard_batches
from packcli.output.rows import read_checked_manifest
from packcli.plan import packing
from packcli.tokenize.encoder import DEFAULT_TOKENIZER

# Row fill bins in percent, right-closed: (0, 50], (50, 75], ... (99, 100]. Fine at the top, where
# packed rows are; a uniform 10% grid would put nearly every row in one bin.
FILL_EDGES_PERCENT = (0, 50, 75, 90, 95, 98, 99, 100)
LENGTH_BINS_TARGET = 24


# -- reading shards --------------------------------------------------------------------------------


def list_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Return (per-row lengths, flat values) of a list column, as numpy arrays."""
    offsets = column.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    values = column.flatten().to_numpy(zero_copy_only=False)
    return np.diff(offsets), values


# -- histograms ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """Counts over right-closed bins ``(edges[i], edges[i + 1]]`` with a label per bin."""

    title: str
    unit: str
    edges: list[float]
    labels: list[str]
    counts: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {"edges": self.edges, "labels": self.labels, "counts": self.counts}


def length_histogram(lengths: np.ndarray, upper: int, title: str = "sample length (tokens)") -> Histogram:
    """Return a histogram of token lengths over (0, upper] in power-of-two wide bins (about 16 of them)."""
    upper = max(int(upper), 1)
    width = 1 << max(0, math.ceil(math.log2(upper / LENGTH_BINS_TARGET))) if upper > LENGTH_BINS_TARGET else 1
    n_bins = -(-upper // width)
    edges = np.arange(n_bins + 1, dtype=np.int64) * width
    longest = int(np.max(lengths)) if len(lengths) else 0
    if longest > edges[-1]:  # longer samples share one last bin, labelled with their real range
        edges = np.append(edges, longest)
    counts = _right_closed_counts(np.asarray(lengths, dtype=np.int64), edges)
    labels = [f"{int(a) + 1}-{int(b)}" if b - a > 1 else f"{int(b)}" for a, b in pairwise(edges)]
    return Histogram(title, "samples", [int(e) for e in edges], labels, counts)


def fill_histogram(row_tokens: np.ndarray, max_len: int, title: str = "row fill") -> Histogram:
    """Return a histogram of row fill (tokens / max_len) over FILL_EDGES_PERCENT."""
    edges = np.asarray(FILL_EDGES_PERCENT, dtype=np.int64)
    # Compare in integers: tokens * 100 against edge * max_len, so 95% of 1000 is exactly 950.
    scaled = np.asarray(row_tokens, dtype=np.int64) * 100
    counts = _right_closed_counts(scaled, edges * int(max_len))
    labels = [f"{a}-{b}%" for a, b in pairwise(edges)]
    return Histogram(title, "rows", [e / 100 for e in FILL_EDGES_PERCENT], labels, counts)


def _right_closed_counts(values: np.ndarray, edges: np.ndarray) -> list[int]:
    # Bin i holds edges[i] < v <= edges[i + 1]; values at or below edges[0] go to the first bin.
    bins = np.clip(np.searchsorted(edges, values, side="left") - 1, 0, len(edges) - 2)
    return [int(c) for c in np.bincount(bins, minlength=len(edges) - 1)]


def _distribution(values: np.ndarray) -> dict[str, float | int]:
    if len(values) == 0:
        return {"min": 0, "mean": 0.0, "median": 0.0, "p90": 0.0, "max": 0}
    v = np.asarray(values, dtype=np.int64)
    return {
        "min": int(v.min()),
        "mean": round(float(v.mean()), 3),
        "median": float(np.median(v)),
        "p90": float(np.percentile(v, 90)),
        "max": int(v.max()),
    }


# -- padding what-ifs ------------------------------------------------------------------------------


def batch_padding(lengths_in_order: np.ndarray, batch_size: int) -> int:
    """Return the padding tokens when consecutive samples form batches padded to their longest sample."""
    x = np.asarray(lengths_in_order, dtype=np.int64)
    if len(x) == 0:
        return 0
    starts = np.arange(0, len(x), batch_size)
    longest = np.maximum.reduceat(x, starts)
    sizes = np.diff(np.append(starts, len(x)))
    return int((longest * sizes).sum() - x.sum())


def _bounds(lengths: np.ndarray, max_len: int, rows: int) -> dict[str, Any]:
    l1 = packing.lower_bound_l1(lengths, max_len)
    l2 = packing.lower_bound_l2(lengths, max_len)
    return {
        "lower_bound_l1": l1,
        "lower_bound_l2": l2,
        "rows_over_l2": rows - l2,
        "rows_over_l2_fraction": round(rows / l2 - 1, 6) if l2 else 0.0,
    }


# -- stats of a packed output ----------------------------------------------------------------------


def is_packed_output(path: Path) -> bool:
    """Return whether ``path`` is a packed output directory (it holds manifest.json)."""
    return path.is_dir() and (path / MANIFEST).is_file()


def output_stats(directory: Path, batch_size: int = 8) -> dict[str, Any]:
    """Return the figures of a packed output directory, read shard by shard.

    ``tokens`` counts sample tokens as the manifest does: the samples' real tokens, without the padding
    segments of ``--pad-to-max`` nor the alignment padding inside samples (``--pad-to-multiple-of``,
    ``--context-parallel``: ``alignment_padding_tokens``); ``padding_tokens`` is ``rows * max_len -
    tokens``. The row-count bounds are on the samples' padded lengths (what the plan packed); the
    lengths and what-ifs on their real lengths, each distinct sample once, in input order.
    """
    _check_batch_size(batch_size)
    manifest = read_checked_manifest(directory)
    max_len = int(manifest.get("max_len") or manifest.get("options", {}).get("max_len", 0))
    if max_len < 1:
        raise OutputError(f"{directory / MANIFEST}: no max_len; the manifest is damaged, pack again")
    row_tokens: list[np.ndarray] = []
    row_samples: list[np.ndarray] = []
    seq_index: list[np.ndarray] = []
    seq_length: list[np.ndarray] = []
    seq_real: list[np.ndarray] = []
    seq_piece: list[np.ndarray] = []
    seq_role: list[np.ndarray] = []
    row_pairs: list[np.ndarray] = []
    trainable = 0
    segment_padding = 0
    shards = manifest.get("shards", [])
    for entry in shards:
        path = directory / entry["file"]
        try:
            columns = ["labels", "seq_lengths", "sample_index"]
            columns += ["piece_index"] if "piece_index" in (manifest.get("columns") or []) else []
            columns += ["sample_role"] if "sample_role" in (manifest.get("columns") or []) else []
            columns += ["seq_lengths_unpadded"] if "seq_lengths_unpadded" in (manifest.get("columns") or []) else []
            for batch in shard_batches(path, columns):
                row_len, labels = list_parts(batch.column("labels"))
                segs, lengths = list_parts(batch.column("seq_lengths"))
                _, index = list_parts(batch.column("sample_index"))
                trainable += int(np.count_nonzero(labels != IGNORE_INDEX))
                pad = index == -1
                seg_row = np.repeat(np.arange(len(segs)), segs)
                pad_per_row = np.bincount(seg_row[pad], weights=lengths[pad], minlength=len(segs)).astype(np.int64)
                segment_padding += int(pad_per_row.sum())
                real = lengths
                if "seq_lengths_unpadded" in columns:
                    _, real = list_parts(batch.column("seq_lengths_unpadded"))
                    real = np.where(pad, lengths, real)  # padding segments are padding_segment_tokens, not this
                alignment = np.bincount(seg_row, weights=lengths - real, minlength=len(segs)).astype(np.int64)
                row_tokens.append(row_len - pad_per_row - alignment)
                row_samples.append(segs - np.bincount(seg_row[pad], minlength=len(segs)))
                seq_index.append(index[~pad].astype(np.int64))
                if "piece_index" in columns:
                    _, piece = list_parts(batch.column("piece_index"))
                    seq_piece.append(piece[~pad].astype(np.int64))
                seq_length.append(lengths[~pad].astype(np.int64))
                seq_real.append(real[~pad].astype(np.int64))
                if "sample_role" in columns:
                    _, role = list_parts(batch.column("sample_role"))
                    seq_role.append(role[~pad].astype(np.int64))
                    row_pairs.append(np.bincount(seg_row[role == CHOSEN], minlength=len(segs)))
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise OutputError(
                f"{entry['file']}: cannot be read ({first_line(exc)}); run packcli verify {directory}"
            ) from exc
    per_row = _concat(row_tokens)
    samples_per_row = _concat(row_samples)
    index = _concat(seq_index)
    lengths = _concat(seq_length)
    real_lengths = _concat(seq_real)
    pieces = _concat(seq_piece) if seq_piece else np.zeros(len(index), np.int64)
    rows = len(per_row)
    tokens = int(real_lengths.sum())
    # Rank padding (--rank-remainder pad) repeats whole rows; bounds and what-ifs count a sample (one
    # (sample_index, piece_index) pair) once. Sorted by the pair: input order.
    distinct, first = np.unique(np.stack([index, pieces], axis=1), axis=0, return_index=True)
    padded_lengths, distinct_lengths = lengths[first], real_lengths[first]
    if len(distinct_lengths) and not (int(distinct_lengths.min()) >= 1 and int(padded_lengths.max()) <= max_len):
        raise OutputError(
            f"{directory}: a sample length is outside 1..max_len {max_len}; run packcli verify {directory}"
        )
    capacity = rows * max_len
    padding_tokens = capacity - tokens
    without = len(distinct) * max_len - int(distinct_lengths.sum())
    batched = batch_padding(distinct_lengths, batch_size)  # np.unique sorts: input order
    counts = manifest.get("counts", {})
    spr_hist = np.bincount(samples_per_row) if rows else np.zeros(0, np.int64)
    pairs = None
    if seq_role:
        # Preference data: a record's samples are one item of the plan, so the bounds are on records.
        roles = _concat(seq_role)[first]
        _, item_of = np.unique(distinct[:, 0], return_inverse=True)
        item_lengths = np.bincount(item_of, weights=padded_lengths).astype(np.int64)
        pairs = _pair_stats(roles, item_of, distinct_lengths, _concat(row_pairs), batch_size)
        bounds = _bounds(item_lengths, max_len, rows)
    elif isinstance(manifest.get("mix"), dict):  # -- mixtures: the plan packed every copy of a repeated record
        bounds = _bounds(lengths, max_len, rows)
    else:
        bounds = _bounds(padded_lengths, max_len, rows)
    out = {
        "mode": "packed",
        "directory": str(directory),
        "max_len": max_len,
        "shards": len(shards),
        "rows": rows,
        "sequences": len(lengths),
        "samples": len(distinct),
        "records": len(np.unique(index)),
        "tokens": tokens,
        "trainable_tokens": trainable,
        "padding_tokens": padding_tokens,
        "padding_segment_tokens": segment_padding,
        "alignment_padding_tokens": int(lengths.sum()) - tokens,
        "fill": round(tokens / capacity, 6) if capacity else 0.0,
        **bounds,
        "samples_per_row": {
            "min": int(samples_per_row.min()) if rows else 0,
            "mean": round(float(samples_per_row.mean()), 3) if rows else 0.0,
            "max": int(samples_per_row.max()) if rows else 0,
            "histogram": [{"samples": k, "rows": int(n)} for k, n in enumerate(spr_hist) if n],
        },
        "sample_length": _distribution(distinct_lengths),
        "length_histogram": length_histogram(distinct_lengths, max_len).to_dict(),
        "row_fill_histogram": fill_histogram(per_row, max_len).to_dict(),
        "records_read": int(counts.get("records_read", 0)),
        "dropped": dict(counts.get("dropped", {})),
        "truncated": int(counts.get("truncated", 0)),
        "duplicated": int(counts.get("duplicated", 0)),
        "batch_size": batch_size,
        "rows_without_packing": len(distinct),
        "padding_tokens_without_packing": without,
        "padding_tokens_batch_padded": batched,
        "padding_saved": without - padding_tokens,
        "padding_saved_vs_batch_padded": batched - padding_tokens,
    }
    if pairs is not None:
        out["preference"] = pairs
    if isinstance(manifest.get("mix"), dict):  # -- mixtures: the manifest's per-source accounting
        out["mix"] = manifest["mix"]
    return out


CHOSEN = 1  # sample_role values (packcli.contract.SAMPLE_ROLES)


def _pair_stats(
    roles: np.ndarray, item_of: np.ndarray, lengths: np.ndarray, pairs_per_row: np.ndarray, batch_size: int
) -> dict[str, Any]:
    """Return the samples by role, the pairs, pairs per row, and the padding of padded pair batches.

    ``padding_tokens_padded_pairs`` is what a trainer that pads pairs gives: batches of ``batch_size``
    consecutive records, each of their samples padded to the batch's longest sample.
    """
    from packcli.contract import SAMPLE_ROLES

    counts = np.bincount(roles, minlength=len(SAMPLE_ROLES))
    records = int(item_of.max()) + 1 if len(item_of) else 0
    per_record = np.bincount(item_of, minlength=records)
    batch_of = np.repeat(np.arange(records) // batch_size, per_record)
    longest = np.zeros(int(batch_of.max()) + 1 if len(batch_of) else 0, dtype=np.int64)
    np.maximum.at(longest, batch_of, lengths)
    padded = int(longest[batch_of].sum() - lengths.sum())
    return {
        "roles": {SAMPLE_ROLES[k]: int(n) for k, n in enumerate(counts) if n},
        "pairs": int(counts[CHOSEN]),
        "pairs_per_row": {
            "min": int(pairs_per_row.min()) if len(pairs_per_row) else 0,
            "mean": round(float(pairs_per_row.mean()), 3) if len(pairs_per_row) else 0.0,
            "max": int(pairs_per_row.max()) if len(pairs_per_row) else 0,
        },
        "padding_tokens_padded_pairs": padded,
        "rows_padded_pairs": len(lengths),
    }


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


# -- what-if on raw input --------------------------------------------------------------------------


def _check_batch_size(batch_size: int) -> None:
    problem = option_problem("batch_size", batch_size)  # the rule of the command line and the library
    if problem:
        raise UsageError(f"--batch-size {problem}")


def parse_max_lens(value: str) -> list[int]:
    """Parse ``--max-len 2048,4096`` into distinct integers >= 2, in the order given."""
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        try:
            n = int(part)
        except ValueError:
            raise UsageError(f"--max-len takes integers separated by commas (e.g. 2048,4096), not '{value}'") from None
        if n < 2:
            raise UsageError(f"--max-len must be at least 2, not {n}")
        if n not in out:
            out.append(n)
    return out


def raw_stats(config: Any, max_lens: Sequence[int], batch_size: int = 8, progress: Any = None) -> dict[str, Any]:
    """Tokenize raw input as ``packcli pack`` would and return, per max length, packed versus unpacked.

    ``config`` is a PackConfig (inputs, tokenizer, template, format, label and cache options).
    Samples longer than a max length are counted as not fitting and left out of that line (what
    ``--overflow drop`` does).
    """
    _check_batch_size(batch_size)
    if not max_lens:
        raise UsageError("a raw input needs --max-len (e.g. --max-len 2048,4096,8192)")
    inputs = config.inputs
    from packcli.io.sources import forget_streams
    from packcli.run.pipeline import tokenized_inputs

    forget_streams()  # stdin and FIFOs named by this run are read by this run

    with tokenized_inputs(config, progress) as tokenized:
        from dataclasses import replace

        config = replace(config, task=tokenized.task)  # preference data: pairs are planned whole
        store, cache_state, warnings = tokenized.store, tokenized.cache, tokenized.warnings
        lengths = store.lengths.astype(np.int64)  # ascending sample_index: input order
        trainable = int(store.trainable.astype(np.int64).sum())
        meta = store.meta
        if meta.get("empty_answers"):
            from packcli.run.accounting import empty_answers_warning

            warnings = [*warnings, empty_answers_warning(int(meta["empty_answers"]))]
        tokenizer_name = config.tokenizer or DEFAULT_TOKENIZER
        lines = [_what_if(lengths, m, batch_size) for m in max_lens]
        for line in lines:
            line["policies"] = _kept_by_policy(config, store, line["max_len"], trainable, progress)
    # Bins up to the 99th percentile (or the largest max length): one outlier does not widen them all.
    upper = max(int(np.percentile(lengths, 99)) if len(lengths) else 0, max(max_lens))
    return {
        "mode": "raw",
        "inputs": list(inputs),
        "tokenizer": tokenizer_name,
        "cache": cache_state,
        "records_read": int(meta["records_read"]),
        "samples": len(lengths),
        "dropped": dict(meta.get("dropped", {})),
        **({"turns_fixed": dict(meta["turns_fixed"])} if "turns_fixed" in meta else {}),
        **({"empty_answers": int(meta["empty_answers"])} if meta.get("empty_answers") else {}),
        "tokens": int(lengths.sum()),
        "trainable_tokens": trainable,
        "sample_length": _distribution(lengths),
        "length_histogram": length_histogram(lengths, upper).to_dict(),
        "batch_size": batch_size,
        "max_lens": lines,
        **({"warnings": warnings} if warnings else {}),
    }


# What each --overflow policy keeps; truncate-left is --overflow truncate --truncate-side left.
POLICIES = ("drop", "truncate", "truncate-left", "split")


def _kept_by_policy(
    config: Any, store: Any, max_len: int, trainable_total: int, progress: Any
) -> dict[str, dict[str, Any]]:
    """Return, per overflow policy, the records, samples, tokens and trainable tokens a pack would keep.

    drop and truncate are planned from the store at hand; split cuts the records longer than
    ``max_len`` as ``pack --overflow split`` does, which tokenizes the inputs again (into the cache,
    so a ``pack --overflow split`` at that length afterwards is a cache hit). Where nothing is too long
    all policies keep everything, and nothing is tokenized again.
    """
    from dataclasses import replace

    from packcli.errors import InputError
    from packcli.plan.planner import make_plan
    from packcli.run import accounting
    from packcli.run.pipeline import tokenized_inputs

    def kept(cfg: Any, tokens: Any) -> dict[str, Any]:
        try:
            summary = accounting.summary(cfg, tokens, make_plan(cfg, tokens), "")
        except InputError:  # nothing left to pack
            summary = {"packed": 0, "samples": 0, "tokens": 0, "trainable_tokens": 0}
        return {
            "records": summary["packed"],
            "samples": summary["samples"],
            "tokens": summary["tokens"],
            "trainable_tokens": summary["trainable_tokens"],
            "trainable_fraction": round(summary["trainable_tokens"] / trainable_total, 6) if trainable_total else 0.0,
        }

    base = replace(config, max_len=max_len, world_size=1, pad_to_max=False)
    out = {
        "drop": kept(replace(base, overflow="drop"), store),
        "truncate": kept(replace(base, overflow="truncate"), store),
        "truncate-left": kept(replace(base, overflow="truncate", truncate_side="left"), store),
    }
    if config.task != "sft":
        # A preference or KTO record is never split: the policy does not apply.
        out["split"] = {**{k: 0 for k in out["drop"]}, "applies": False}
    elif int(store.lengths.max(initial=0)) <= max_len:
        out["split"] = dict(out["drop"])
    else:
        split = replace(base, overflow="split")
        with tokenized_inputs(split, progress) as pieces:
            out["split"] = kept(split, pieces.store)
    return out


def _what_if(lengths: np.ndarray, max_len: int, batch_size: int) -> dict[str, Any]:
    fit = lengths[lengths <= max_len]
    tokens = int(fit.sum())
    if len(fit):
        bins = packing.plan_rows(fit, max_len, "ffd")
        row_tokens = np.bincount(bins, weights=fit).astype(np.int64)
    else:
        row_tokens = np.zeros(0, np.int64)
    rows = len(row_tokens)
    return {
        "max_len": max_len,
        "samples_fit": len(fit),
        "samples_too_long": len(lengths) - len(fit),
        "tokens": tokens,
        "rows": rows,
        "rows_without_packing": len(fit),
        "padding_tokens": rows * max_len - tokens,
        "padding_tokens_without_packing": len(fit) * max_len - tokens,
        "padding_tokens_batch_padded": batch_padding(fit, batch_size),
        "fill": round(tokens / (rows * max_len), 6) if rows else 0.0,
        **_bounds(fit, max_len, rows),
        "row_fill_histogram": fill_histogram(row_tokens, max_len).to_dict(),
    }


# -- pictures --------------------------------------------------------------------------------------
