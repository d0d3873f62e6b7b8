"""Pictures of the statistics: a self-contained HTML page (inline SVG), or a PNG through matplotlib."""

from __future__ import annotations

import html
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

from packcli.errors import OutputError, UsageError
from packcli.report.stats import Histogram

PLOT_SUFFIXES = (".html", ".htm", ".png")


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
