"""The tables of ``packcli stats`` on stdout: a packed output's (``print_packed_stats``) and the inputs'
before packing (``print_raw_stats``), with their terminal histograms.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from packcli.cli.consoles import stdout
from packcli.cli.pack_summary import mix_table, reasoning_words, step_idle_words
from packcli.results import MixSummary, OutputStats, RawStats

BAR_WIDTH = 32


def print_packed_stats(r: OutputStats) -> None:
    out = stdout
    table = Table(title=f"packcli stats {r['directory']}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("rows", f"{r['rows']:,} in {r['shards']} shard{'s' if r['shards'] != 1 else ''}")
    of_records = f" of {r['records']:,} records" if r.get("records", r["samples"]) != r["samples"] else ""
    table.add_row("sequences", f"{r['sequences']:,} ({r['samples']:,} distinct samples{of_records})")
    table.add_row("tokens", f"{r['tokens']:,}")
    table.add_row("trainable tokens", f"{r['trainable_tokens']:,} ({_ratio(r['trainable_tokens'], r['tokens'])})")
    table.add_row("padding tokens", f"{r['padding_tokens']:,} (to max_len {r['max_len']:,})")
    table.add_row("fill", f"{r['fill']:.2%}")
    table.add_row(
        "rows over L2 bound",
        f"{r['rows_over_l2']:,} ({r['rows_over_l2_fraction']:.3%}; L2 = {r['lower_bound_l2']:,})",
    )
    if r.step_balance is not None:
        table.add_row(f"idle at steps ({r.step_balance.balance})", step_idle_words(r.step_balance))
    spr = r["samples_per_row"]
    table.add_row("samples per row", f"min {spr['min']} / mean {spr['mean']:.2f} / max {spr['max']}")
    if "preference" in r:
        pref = r["preference"]
        table.add_row("samples by role", ", ".join(f"{name} {n:,}" for name, n in pref["roles"].items()))
        if pref["pairs"]:
            ppr = pref["pairs_per_row"]
            table.add_row(
                "pairs", f"{pref['pairs']:,} (per row: min {ppr['min']} / mean {ppr['mean']:.2f} / max {ppr['max']})"
            )
        table.add_row(
            "padding, pairs padded",
            f"{pref['padding_tokens_padded_pairs']:,} tokens in batches of {r['batch_size']} records",
        )
    if "images" in r:
        im = r["images"]
        table.add_row("images", f"{im['images']:,} in {im['samples']:,} samples")
        table.add_row("image tokens", f"{im['image_tokens']:,} ({im['image_token_share']:.1%} of tokens)")
        table.add_row("images per row", f"mean {im['per_row']['mean']:.2f} / max {im['per_row']['max']}")
        table.add_row("images embedded", f"{im['embedded']:,} (by path: {im['referenced']:,})")
    if "prefix_trees" in r:
        pt = r["prefix_trees"]
        table.add_row(
            "prefix trees",
            f"{pt['tokens']:,} tokens for {pt['expanded_tokens']:,} expanded ({pt['tokens_ratio']:.1%}; "
            f"{pt['tokens_saved']:,} saved)",
        )
    table.add_row("records read", f"{r['records_read']:,}")
    for reason, n in r["dropped"].items():
        table.add_row(f"dropped: {reason}", f"{n:,}")
    if r.get("reasoning"):
        table.add_row("reasoning left out", reasoning_words(r["reasoning"]))
    if r["truncated"]:
        table.add_row("truncated", f"{r['truncated']:,}")
    if r["duplicated"]:
        table.add_row("duplicated (rank padding)", f"{r['duplicated']:,}")
    if "eval" in r:
        held = r["eval"]
        table.add_row(
            f"eval ({held['path']}/)", f"{held['records']:,} records, {held['tokens']:,} tokens, {held['rows']:,} rows"
        )
    out.print(table)
    if "mix" in r and all("realised" in s for s in r["mix"]["sources"]):  # an eval split's names its sources only
        out.print(mix_table(MixSummary.from_dict(r["mix"])))

    saved = Table(title="what packing saved (padding tokens)", title_justify="left")
    saved.add_column("layout")
    saved.add_column("rows", justify="right")
    saved.add_column("padding", justify="right")
    saved.add_column("saved by packing", justify="right")
    saved.add_row("packed rows, padded to max_len", f"{r['rows']:,}", f"{r['padding_tokens']:,}", "")
    saved.add_row(
        "each sample padded to max_len",
        f"{r['rows_without_packing']:,}",
        f"{r['padding_tokens_without_packing']:,}",
        f"{r['padding_saved']:,}",
    )
    saved.add_row(
        f"batches of {r['batch_size']} padded to their longest",
        f"{r['rows_without_packing']:,}",
        f"{r['padding_tokens_batch_padded']:,}",
        f"{r['padding_saved_vs_batch_padded']:,}",
    )
    out.print(saved)
    spr_hist = {
        "labels": [str(h["samples"]) for h in spr["histogram"]],
        "counts": [h["rows"] for h in spr["histogram"]],
    }
    out.print(_histogram_table("samples per row", "samples", "rows", spr_hist))
    out.print(_histogram_table("row fill", "fill", "rows", r["row_fill_histogram"]))
    out.print(_histogram_table("sample length (tokens)", "tokens", "samples", r["length_histogram"]))


def print_raw_stats(r: RawStats) -> None:
    out = stdout
    title = f"packcli stats (before packing): {', '.join(r['inputs'])}"
    head = Table(title=title, show_header=False, title_justify="left")
    head.add_column("what", style="bold")
    head.add_column("value", justify="right")
    head.add_row("tokenizer", r["tokenizer"])
    head.add_row("records read", f"{r['records_read']:,}")
    head.add_row("samples", f"{r['samples']:,}")
    for reason, n in r["dropped"].items():
        head.add_row(f"dropped: {reason}", f"{n:,}")
    for kind, n in (r.get("turns_fixed") or {}).items():
        head.add_row(f"turns fixed: {kind}", f"{n:,}")
    if r.get("empty_answers"):
        head.add_row("empty answers trained", f"{r['empty_answers']:,}")
    if r.get("leading_answers"):
        head.add_row("answers to nothing trained", f"{r['leading_answers']:,}")
    if r.get("reasoning"):
        head.add_row("reasoning left out", reasoning_words(r["reasoning"]))
    head.add_row("tokens", f"{r['tokens']:,}")
    head.add_row("trainable tokens", f"{r['trainable_tokens']:,}")
    dist = r["sample_length"]
    head.add_row(
        "sample length",
        f"min {dist['min']:,} / median {dist['median']:,.0f} / p90 {dist['p90']:,.0f} / max {dist['max']:,}",
    )
    head.add_row("cache", r["cache"])
    out.print(head)

    table = Table(title="what-if per max length (samples that do not fit are left out)", title_justify="left")
    for name in ("max-len", "too long", "rows packed", "rows unpacked", "padding packed", "padding unpacked"):
        table.add_column(name, justify="right")
    table.add_column(f"padding batch {r['batch_size']}", justify="right")
    table.add_column("fill", justify="right")
    table.add_column("over L2", justify="right")
    for line in r["max_lens"]:
        table.add_row(
            f"{line['max_len']:,}",
            f"{line['samples_too_long']:,}",
            f"{line['rows']:,}",
            f"{line['rows_without_packing']:,}",
            f"{line['padding_tokens']:,}",
            f"{line['padding_tokens_without_packing']:,}",
            f"{line['padding_tokens_batch_padded']:,}",
            f"{line['fill']:.2%}",
            f"{line['rows_over_l2']:,}",
        )
    out.print(table)
    kept = Table(title="what each --overflow policy keeps (records / trainable tokens)", title_justify="left")
    kept.add_column("max-len", justify="right")
    for policy in ("drop", "truncate", "truncate-left", "split"):
        kept.add_column(policy, justify="right")
    for line in r["max_lens"]:
        cells = [
            f"{p['records']:,} / {p['trainable_tokens']:,} ({p['trainable_fraction']:.1%})"
            if p.get("applies", True)
            else "-"
            for p in (line["policies"][name] for name in ("drop", "truncate", "truncate-left", "split"))
        ]
        kept.add_row(f"{line['max_len']:,}", *cells)
    out.print(kept)
    out.print(_histogram_table("sample length (tokens)", "tokens", "samples", r["length_histogram"]))


def _ratio(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _histogram_table(title: str, bin_name: str, unit: str, hist: dict[str, Any]) -> Table:
    """Return a terminal histogram: one line per bin, from the first non-empty bin to the last."""
    counts = list(hist["counts"])
    labels = list(hist["labels"])
    nonzero = [i for i, c in enumerate(counts) if c]
    table = Table(title=title, title_justify="left", box=None, padding=(0, 1))
    table.add_column(bin_name, justify="right")
    table.add_column(unit, justify="right")
    table.add_column("", no_wrap=True)
    if not nonzero:
        return table
    peak = max(counts)
    for i in range(nonzero[0], nonzero[-1] + 1):
        n = counts[i]
        bar = "█" * max(1, round(BAR_WIDTH * n / peak)) if n else ""
        table.add_row(labels[i], f"{n:,}", Text(bar, style="cyan"))
    return table
