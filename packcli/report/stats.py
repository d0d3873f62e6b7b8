"""Figures about packed rows (from an output directory) or about raw input before packing (a what-if).

Both read sample lengths only: a packed output shard by shard and a batch of rows at a time, a raw
input through the same reading, formatting and tokenization as ``packcli pack`` (and the same
tokenization cache, so a later ``pack`` of the same input reuses it). Nothing here prints; the
functions return plain dictionaries that the CLI renders or dumps as JSON.
"""

from __future__ import annotations

import html
import importlib.util
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packcli import packing
from packcli.contract import IGNORE_INDEX, MANIFEST
from packcli.errors import OutputError, UsageError, first_line
from packcli.shard_formats import shard_batches
from packcli.shards import read_checked_manifest
from packcli.tokenize import DEFAULT_TOKENIZER

# Row fill bins in percent, right-closed: (0, 50], (50, 75], ... (99, 100]. Fine at the top, where
# packed rows are; a uniform 10% grid would put nearly every row in one bin.
FILL_EDGES_PERCENT = (0, 50, 75, 90, 95, 98, 99, 100)
LENGTH_BINS_TARGET = 24
PLOT_SUFFIXES = (".html", ".htm", ".png")


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

    ``tokens`` counts sample tokens (padding segments of ``--pad-to-max`` excluded); ``padding_tokens``
    is ``rows * max_len - tokens``. The what-ifs use each distinct sample once, in input order.
    """
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {batch_size}")
    manifest = read_checked_manifest(directory)
    max_len = int(manifest.get("max_len") or manifest.get("options", {}).get("max_len", 0))
    if max_len < 1:
        raise OutputError(f"{directory / MANIFEST}: no max_len; the manifest is damaged, pack again")
    row_tokens: list[np.ndarray] = []
    row_samples: list[np.ndarray] = []
    seq_index: list[np.ndarray] = []
    seq_length: list[np.ndarray] = []
    trainable = 0
    segment_padding = 0
    shards = manifest.get("shards", [])
    for entry in shards:
        path = directory / entry["file"]
        try:
            for batch in shard_batches(path, ["labels", "seq_lengths", "sample_index"]):
                row_len, labels = list_parts(batch.column("labels"))
                segs, lengths = list_parts(batch.column("seq_lengths"))
                _, index = list_parts(batch.column("sample_index"))
                trainable += int(np.count_nonzero(labels != IGNORE_INDEX))
                pad = index == -1
                seg_row = np.repeat(np.arange(len(segs)), segs)
                pad_per_row = np.bincount(seg_row[pad], weights=lengths[pad], minlength=len(segs)).astype(np.int64)
                segment_padding += int(pad_per_row.sum())
                row_tokens.append(row_len - pad_per_row)
                row_samples.append(segs - np.bincount(seg_row[pad], minlength=len(segs)))
                seq_index.append(index[~pad].astype(np.int64))
                seq_length.append(lengths[~pad].astype(np.int64))
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise OutputError(
                f"{entry['file']}: cannot be read ({first_line(exc)}); run packcli verify {directory}"
            ) from exc
    per_row = _concat(row_tokens)
    samples_per_row = _concat(row_samples)
    index = _concat(seq_index)
    lengths = _concat(seq_length)
    rows = len(per_row)
    tokens = int(lengths.sum())
    # Rank padding (--rank-remainder pad) repeats whole rows; bounds and what-ifs count a sample once.
    distinct, first = np.unique(index, return_index=True)
    distinct_lengths = lengths[first]
    if len(distinct_lengths) and not 1 <= int(distinct_lengths.min()) <= int(distinct_lengths.max()) <= max_len:
        raise OutputError(
            f"{directory}: a sample length is outside 1..max_len {max_len}; run packcli verify {directory}"
        )
    capacity = rows * max_len
    padding_tokens = capacity - tokens
    without = len(distinct) * max_len - int(distinct_lengths.sum())
    batched = batch_padding(distinct_lengths, batch_size)  # np.unique sorts: input order
    counts = manifest.get("counts", {})
    spr_hist = np.bincount(samples_per_row) if rows else np.zeros(0, np.int64)
    return {
        "mode": "packed",
        "directory": str(directory),
        "max_len": max_len,
        "shards": len(shards),
        "rows": rows,
        "sequences": len(lengths),
        "samples": len(distinct),
        "tokens": tokens,
        "trainable_tokens": trainable,
        "padding_tokens": padding_tokens,
        "padding_segment_tokens": segment_padding,
        "fill": round(tokens / capacity, 6) if capacity else 0.0,
        **_bounds(distinct_lengths, max_len, rows),
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


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


# -- what-if on raw input --------------------------------------------------------------------------


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
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {batch_size}")
    if not max_lens:
        raise UsageError("a raw input needs --max-len (e.g. --max-len 2048,4096,8192)")
    inputs = config.inputs
    from packcli.pipeline import tokenized_inputs

    with tokenized_inputs(config, progress) as tokenized:
        store, cache_state, warnings = tokenized.store, tokenized.cache, tokenized.warnings
        lengths = store.lengths.astype(np.int64)  # ascending sample_index: input order
        trainable = int(store.trainable.astype(np.int64).sum())
        meta = store.meta
        tokenizer_name = config.tokenizer or DEFAULT_TOKENIZER
    lines = [_what_if(lengths, m, batch_size) for m in max_lens]
    upper = max(int(lengths.max()) if len(lengths) else 0, max(max_lens))
    return {
        "mode": "raw",
        "inputs": list(inputs),
        "tokenizer": tokenizer_name,
        "cache": cache_state,
        "records_read": int(meta["records_read"]),
        "samples": len(lengths),
        "dropped": dict(meta.get("dropped", {})),
        "tokens": int(lengths.sum()),
        "trainable_tokens": trainable,
        "sample_length": _distribution(lengths),
        "length_histogram": length_histogram(lengths, upper).to_dict(),
        "batch_size": batch_size,
        "max_lens": lines,
        **({"warnings": warnings} if warnings else {}),
    }


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


def check_plot_path(path: str) -> None:
    """Raise UsageError unless ``path`` ends in .html/.htm, or .png with matplotlib importable."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise UsageError(f"--plot writes .html or .png, not '{suffix or path}'; name the file FILE.html or FILE.png")
    if suffix == ".png" and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            "--plot FILE.png needs matplotlib, which is not installed; pip install matplotlib, "
            "or write FILE.html (no dependency)"
        )


def plot_histograms(result: dict[str, Any]) -> list[Histogram]:
    """Return the histograms to draw for a stats result: lengths, then row fill (per max length)."""
    lh = result["length_histogram"]
    charts = [Histogram("Sample length (tokens)", "samples", lh["edges"], lh["labels"], lh["counts"])]
    if result["mode"] == "packed":
        fh = result["row_fill_histogram"]
        title = f"Row fill (max_len {result['max_len']})"
        charts.append(Histogram(title, "rows", fh["edges"], fh["labels"], fh["counts"]))
    else:
        for line in result["max_lens"]:
            fh = line["row_fill_histogram"]
            title = f"Row fill if packed at max_len {line['max_len']}"
            charts.append(Histogram(title, "rows", fh["edges"], fh["labels"], fh["counts"]))
    return charts


def write_plot(path: str, title: str, summary: list[tuple[str, str]], charts: list[Histogram]) -> None:
    """Write the histograms as a self-contained HTML page (inline SVG) or a PNG, atomically."""
    check_plot_path(path)
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the plot ({exc.strerror or exc})") from exc
    try:
        if target.suffix.lower() == ".png":
            _write_png(Path(tmp), title, charts)
        else:
            Path(tmp).write_text(render_html(title, summary, charts), encoding="utf-8")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{path}: cannot write the plot ({exc.strerror or exc})") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def render_html(title: str, summary: list[tuple[str, str]], charts: list[Histogram]) -> str:
    """Return a self-contained HTML page: a summary table and one SVG bar chart per histogram."""
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary)
    figures = "\n".join(_svg_bars(chart) for chart in charts)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ padding: 2px 12px; text-align: left; border-bottom: 1px solid #ddd; }}
td {{ text-align: right; font-variant-numeric: tabular-nums; }}
figure {{ margin: 0 0 2em 0; }}
figcaption {{ font-weight: 600; margin-bottom: 0.3em; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<table>
{rows}
</table>
{figures}
</body></html>
"""


def _svg_bars(chart: Histogram) -> str:
    width, height, left, bottom, top = 760, 280, 56, 70, 16
    plot_w, plot_h = width - left - 10, height - bottom - top
    n = max(len(chart.counts), 1)
    peak = max(chart.counts, default=0) or 1
    step = plot_w / n
    parts = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#444"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#444"/>',
        f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" font-size="11">{peak:,}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end" font-size="11">0</text>',
    ]
    for i, (label, count) in enumerate(zip(chart.labels, chart.counts, strict=True)):
        h = plot_h * count / peak
        x = left + i * step
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{top + plot_h - h:.1f}" width="{max(step - 2, 1):.1f}" height="{h:.1f}" '
            f'fill="#3b7dd8"><title>{html.escape(label)}: {count:,} {chart.unit}</title></rect>'
        )
        cx, cy = x + step / 2, top + plot_h + 8
        parts.append(
            f'<text x="{cx:.1f}" y="{cy:.1f}" font-size="10" text-anchor="end" '
            f'transform="rotate(-45 {cx:.1f} {cy:.1f})">{html.escape(label)}</text>'
        )
    body = "\n".join(parts)
    return (
        f"<figure><figcaption>{html.escape(chart.title)} ({html.escape(chart.unit)} per bin)</figcaption>\n"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(chart.title)}">\n{body}\n</svg></figure>'
    )


def _write_png(path: Path, title: str, charts: list[Histogram]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(charts), 1, figsize=(10, 3.6 * len(charts)), squeeze=False)
    for ax, chart in zip(axes[:, 0], charts, strict=True):
        ax.bar(range(len(chart.counts)), chart.counts, color="#3b7dd8")
        ax.set_xticks(range(len(chart.labels)))
        ax.set_xticklabels(chart.labels, rotation=45, ha="right", fontsize=8)
        ax.set_title(chart.title)
        ax.set_ylabel(chart.unit)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(path), format="png", dpi=100)
    plt.close(fig)
