"""The HTML report: bins that one outlier does not widen, axis titles, ticks, and the charts the terminal has."""

from __future__ import annotations

import re

import numpy as np

from packcli.report.figures import length_histogram
from packcli.report.plot import _nice_ticks, plot_histograms, render_html


def test_an_outlier_gets_its_own_last_bin() -> None:
    lengths = np.array([10, 50, 100, 120, 300, 163_000])
    h = length_histogram(lengths, 512)
    assert h.edges[-2] == 512 and h.edges[-1] == 163_000  # bins up to 512 stay 32 wide
    assert h.edges[1] - h.edges[0] == 32
    assert h.labels[-1] == "513-163000" and h.counts[-1] == 1 and sum(h.counts) == 6
    # Without an outlier nothing is added.
    assert length_histogram(lengths[:-1], 512).edges[-1] == 512


def test_ticks_are_round_and_reach_the_peak() -> None:
    assert _nice_ticks(167) == [0, 50, 100, 150, 200]
    assert _nice_ticks(7) == [0, 2, 4, 6, 8]
    assert _nice_ticks(1) == [0, 1]
    assert _nice_ticks(0) == [0, 1]


def _packed_result() -> dict:
    return {
        "mode": "packed",
        "max_len": 1024,
        "length_histogram": length_histogram(np.array([5, 60, 900]), 1024).bins().to_dict(),
        "row_fill_histogram": {"edges": [0, 0.5, 1], "labels": ["0-50%", "50-100%"], "counts": [1, 3]},
        "samples_per_row": {"histogram": [{"samples": 2, "rows": 3}, {"samples": 5, "rows": 1}]},
    }


def test_packed_page_has_samples_per_row_axis_titles_and_ticks() -> None:
    charts = plot_histograms(_packed_result())
    assert [c.title for c in charts][2] == "Samples per row"
    per_row = charts[2]
    assert per_row.labels == ["2", "3", "4", "5"] and per_row.counts == [3, 0, 0, 1]  # empty counts shown
    page = render_html("t", [("dropped: too_long", "1")], charts)
    assert page.count("<svg") == 3
    for title in ("sample length (tokens)", "row fill (tokens / max_len)", "samples in the row"):
        assert f">{title}</text>" in page
    ticks = [re.findall(r'text-anchor="end" font-size="11">([\d,]+)</text>', svg) for svg in page.split("<svg")[1:]]
    # y ticks per chart: lengths peak at 2 (5 and 60 share the 1-64 bin), fill at 3, samples per row at 3.
    assert ticks == [["0", "1", "2"], ["0", "1", "2", "3"], ["0", "1", "2", "3"]]
    assert "dropped: too_long" in page


def test_raw_page_charts_the_samples_too_long_per_max_len() -> None:
    result = {
        "mode": "raw",
        "length_histogram": length_histogram(np.array([5, 60, 4000]), 2048).bins().to_dict(),
        "max_lens": [
            {"max_len": m, "samples_too_long": k, "row_fill_histogram": _packed_result()["row_fill_histogram"]}
            for m, k in ((512, 7), (2048, 1))
        ],
    }
    charts = plot_histograms(result)
    assert charts[-1].labels == ["512", "2,048"] and charts[-1].counts == [7, 1]
    assert len(charts) == 4
