"""Pictures of the statistics: a self-contained HTML page (inline SVG), or a PNG through matplotlib."""

from __future__ import annotations

import html
import importlib.util
import math
import os
import tempfile
from pathlib import Path

from packcli.errors import OutputError, UsageError
from packcli.report.figures import Histogram
from packcli.results import OutputStats, RawStats

PLOT_SUFFIXES = (".html", ".htm", ".png")


def check_plot_path(path: str) -> None:
    """Raise UsageError unless ``path`` ends in .html/.htm, or .png with matplotlib importable."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise UsageError(
            f"writes .html or .png, not '{suffix or path}'; name the file FILE.html or FILE.png", option="plot"
        )
    if suffix == ".png" and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            "FILE.png needs matplotlib, which is not installed; pip install matplotlib, "
            "or write FILE.html (no dependency)",
            option="plot",
        )


# What the x axis of each chart counts, by the start of its title.
X_TITLES = {
    "Sample length": "sample length (tokens)",
    "Row fill": "row fill (tokens / max_len)",
    "Samples per row": "samples in the row",
    "Samples too long": "max_len",
}


def plot_histograms(result: OutputStats | RawStats) -> list[Histogram]:
    """Return the charts of a stats result: lengths, row fill (per max length), samples per row or drops.

    Sample lengths are binned up to the 99th percentile or the largest max length, whichever is
    larger; longer samples share one last bin (see ``report.figures.length_histogram``), so that one
    outlier does not squeeze every other sample into one bar.
    """
    lh = result["length_histogram"]
    charts = [Histogram("Sample length (tokens)", "samples", lh["edges"], lh["labels"], lh["counts"])]
    if result["mode"] == "packed":
        fh = result["row_fill_histogram"]
        title = f"Row fill (max_len {result['max_len']})"
        charts.append(Histogram(title, "rows", fh["edges"], fh["labels"], fh["counts"]))
        rows_by_k = {h["samples"]: h["rows"] for h in result["samples_per_row"]["histogram"]}
        ks = list(range(min(rows_by_k, default=0), max(rows_by_k, default=0) + 1))
        counts = [rows_by_k.get(k, 0) for k in ks]
        charts.append(Histogram("Samples per row", "rows", [float(k) for k in ks], [str(k) for k in ks], counts))
    else:
        for line in result["max_lens"]:
            fh = line["row_fill_histogram"]
            title = f"Row fill if packed at max_len {line['max_len']}"
            charts.append(Histogram(title, "rows", fh["edges"], fh["labels"], fh["counts"]))
        lines = result["max_lens"]
        charts.append(
            Histogram(
                "Samples too long (dropped by --overflow drop) per max_len",
                "samples",
                [float(x["max_len"]) for x in lines],
                [f"{x['max_len']:,}" for x in lines],
                [x["samples_too_long"] for x in lines],
            )
        )
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
th {{ white-space: nowrap; }}
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


def _nice_ticks(peak: int) -> list[int]:
    """Return 0 and round tick values up to at least ``peak`` (steps of 1, 2 or 5 times a power of ten)."""
    if peak <= 0:
        return [0, 1]
    raw = peak / 4
    power = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    step = max(int(step), 1)
    return list(range(0, -(-peak // step) * step + 1, step))


def _x_title(chart: Histogram) -> str:
    return next((t for prefix, t in X_TITLES.items() if chart.title.startswith(prefix)), "")


def _svg_bars(chart: Histogram) -> str:
    width, height, left, bottom, top = 780, 320, 76, 96, 16
    plot_w, plot_h = width - left - 10, height - bottom - top
    n = max(len(chart.counts), 1)
    ticks = _nice_ticks(max(chart.counts, default=0))
    peak = ticks[-1]
    step = plot_w / n
    parts = [
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#444"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#444"/>',
    ]
    for tick in ticks:
        y = top + plot_h - plot_h * tick / peak
        parts.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        parts.append(f'<text x="{left - 7}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{tick:,}</text>')
    for i, (label, count) in enumerate(zip(chart.labels, chart.counts, strict=True)):
        h = plot_h * count / peak
        x = left + i * step
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{top + plot_h - h:.1f}" width="{max(step - 2, 1):.1f}" height="{h:.1f}" '
            f'fill="#3b7dd8"><title>{html.escape(label)}: {count:,} {chart.unit}</title></rect>'
        )
        if count and step >= 18:  # the count above its bar, where there is room
            parts.append(
                f'<text x="{x + step / 2:.1f}" y="{top + plot_h - h - 3:.1f}" font-size="9" text-anchor="middle" '
                f'fill="#333">{count:,}</text>'
            )
        cx, cy = x + step / 2, top + plot_h + 8
        parts.append(
            f'<text x="{cx:.1f}" y="{cy:.1f}" font-size="10" text-anchor="end" '
            f'transform="rotate(-45 {cx:.1f} {cy:.1f})">{html.escape(label)}</text>'
        )
    mid_y = top + plot_h / 2
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" font-size="12" text-anchor="middle">'
        f"{html.escape(_x_title(chart))}</text>"
    )
    parts.append(
        f'<text x="14" y="{mid_y:.1f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {mid_y:.1f})">{html.escape(chart.unit)}</text>'
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
        ax.set_xlabel(_x_title(chart))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(path), format="png", dpi=100)
    plt.close(fig)
