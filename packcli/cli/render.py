"""Everything a person sees: progress bars and summary tables on stderr, via rich."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from contextvars import ContextVar
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from packcli.results import EncoderInfo, MixSummary, OutputStats, RawStats, RunSummary

stderr = Console(stderr=True, highlight=False)
stdout = Console(highlight=False, emoji=False)

STAGE_LABELS = {"tokenize": "Tokenizing records", "write": "Writing rows"}


# The stdout that --json writes to, while everything else written to stdout goes to stderr.
_JSON_STDOUT: ContextVar[Any] = ContextVar("json_stdout", default=None)


@contextmanager
def stdout_for_json(enabled: bool) -> Iterator[None]:
    """While a ``--json`` command runs, keep stdout for its JSON: other writes to it go to stderr.

    Libraries print there too (Ray's driver prints a task's retry notice on stdout), and one such line
    would make the output unreadable by ``json.load``. ``emit_json`` writes to the stdout kept here.
    """
    if not enabled:
        yield
        return
    kept = _JSON_STDOUT.set(sys.stdout)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STDOUT.reset(kept)


def emit_json(data: Any, ensure_ascii: bool = True) -> None:
    """Write ``data`` as indented JSON (one document) to stdout, the one kept by ``stdout_for_json``."""
    import json

    stream = _JSON_STDOUT.get() or sys.stdout
    stream.write(json.dumps(data, indent=2, ensure_ascii=ensure_ascii) + "\n")
    stream.flush()


def error(message: str) -> None:
    """Print one error line on stderr."""
    stderr.print(f"[bold red]Error:[/] {escape(message)}", soft_wrap=True, markup=True, highlight=False, emoji=False)


def warning(message: str) -> None:
    """Print one warning line on stderr."""
    stderr.print(
        f"[bold yellow]Warning:[/] {escape(message)}", soft_wrap=True, markup=True, highlight=False, emoji=False
    )


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Any]:
    """Yield a progress callback (stage, advance, total); bars only on a terminal and when enabled."""
    if not enabled or not sys.stderr.isatty():
        yield lambda stage, advance, total: None
        return
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=stderr,
        transient=False,
    )
    tasks: dict[str, TaskID] = {}

    def update(stage: str, advance: int, total: int | None) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(STAGE_LABELS.get(stage, stage), total=total, rate="")
        task = tasks[stage]
        bars.update(task, advance=advance, total=total)
        speed = bars.tasks[task].speed
        if speed:
            bars.update(task, rate=f"{speed:,.0f}/s")

    with bars:
        yield update


def reasoning_words(reasoning: dict[str, int]) -> str:
    """Return the reasoning count of a summary as one table cell: "2 of 3 turns (1 record)"."""
    records = reasoning["records_left_out"]
    return f"{reasoning['turns_left_out']:,} of {reasoning['turns']:,} turns ({records:,} record{'s' * (records != 1)})"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# How the summary's template_source reads in the table.
TEMPLATE_SOURCES = {
    "tokenizer": "the tokenizer's own",
    "file": "file",
    "packcli": "packcli's",
    "default": "packcli's default for this tokenizer",
    "processor": "the processor's (--processor)",
}


def encoder_line(encoder: EncoderInfo) -> str:
    """The text encoder that made the tokens, why it is not the fast one, and the records it left to tokenizers."""
    line = encoder.name
    if encoder.fallback:
        line += f" (fastokens not used: {encoder.fallback})"
    if encoder.records_slow:
        line += f"; {encoder.records_slow:,} records' masks made by tokenizers"
    return line


def _cache_words(summary: RunSummary) -> str:
    """The cache state; with the parts a missed entry was assembled from, what they saved."""
    parts = summary.cache_parts
    if parts is None or summary.cache != "miss":
        return summary.cache
    return (
        f"miss: {parts.records_tokenized:,} records tokenized, {parts.records_reused:,} reused "
        f"({parts.parts_made:,} parts made, {parts.parts_reused:,} found)"
    )


def print_pack_summary(summary: RunSummary) -> None:
    """Render the pack summary as a table on stderr."""
    table = Table(title="packcli pack", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("tokenizer", summary.tokenizer)
    table.add_row("template", f"{summary.template} ({TEMPLATE_SOURCES[summary.template_source]})")
    table.add_row("task", summary.task)
    if summary.encoder is not None:
        table.add_row("encoder", encoder_line(summary.encoder))
    table.add_row("records read", _fmt(summary.records_read))
    table.add_row("packed", _fmt(summary.packed))
    for reason, count in summary.dropped.items():
        table.add_row(f"dropped: {reason}", _fmt(count))
    split = summary.split
    if split:
        table.add_row("samples", _fmt(summary.samples))
        table.add_row("split", f"{split.records_split:,} records into {split.pieces:,} pieces")
        for reason, count in split.pieces_left_out.items():
            table.add_row(f"pieces left out: {reason}", _fmt(count))
    for kind, count in (summary.turns_fixed or {}).items():
        table.add_row(f"turns fixed: {kind}", _fmt(count))
    if summary.empty_answers:
        table.add_row("empty answers trained", _fmt(summary.empty_answers))
    if summary.leading_answers:
        table.add_row("answers to nothing trained", _fmt(summary.leading_answers))
    if summary.tools_left_out:
        table.add_row("tools lists not rendered", _fmt(summary.tools_left_out))
    if summary.reasoning:
        table.add_row("reasoning left out", reasoning_words(summary.reasoning))
    if summary.expanded is not None:
        e = summary.expanded
        table.add_row(
            "expanded by round",
            f"{e['records']:,} records into {e['samples']:,} samples, +{e['extra_tokens']:,} tokens",
        )
    if summary.trees is not None and summary.trees["records"]:
        t = summary.trees
        table.add_row(
            "prefix trees",
            f"{t['samples']:,} samples as {t['trees']:,} trees: {t['tokens']:,} tokens for the expansion's "
            f"{t['expansion_tokens']:,} ({t['tokens'] / t['expansion_tokens']:.1%})",
        )
    if split is not None and split.exchanges_cut is not None:
        side = "the start of the prompt" if split.cut_side == "left" else "the end"
        table.add_row("exchanges cut (one over --max-len)", f"{split.exchanges_cut:,} (cut from {side})")
    elif summary.truncated:
        table.add_row("truncated", _fmt(summary.truncated))
    if summary.duplicated:
        table.add_row("duplicated (rank padding)", _fmt(summary.duplicated))
    table.add_row("tokens", _fmt(summary.tokens))
    table.add_row("trainable tokens", _fmt(summary.trainable_tokens))
    table.add_row("rows", _fmt(summary.rows))
    table.add_row("fill", f"{summary.fill:.2%}")
    table.add_row(
        "rows over L2 bound",
        f"{summary.rows_over_l2:,} ({summary.rows_over_l2_fraction:.3%}; L2 = {summary.lower_bound_l2:,})",
    )
    without = summary.padding_tokens_without_packing
    table.add_row(
        "padding saved",
        f"{without - summary.padding_tokens:,} tokens ({summary.rows_without_packing:,} rows unpacked)",
    )
    if summary.world_size > 1:
        table.add_row("rank token spread", f"{summary.rank_token_spread:.3%}")
    if summary.mix is not None and summary.mix.records_left_out:
        table.add_row("left out by the mix", f"{summary.mix.records_left_out:,} records")
    if summary.eval is not None:
        held = summary.eval
        table.add_row(f"eval ({held.path}/)", f"{held.records:,} records, {held.tokens:,} tokens, {held.rows:,} rows")
    table.add_row("cache", _cache_words(summary))
    if summary.seconds is not None:
        table.add_row("time", f"{summary.seconds.total:.1f} s ({summary.tokens_per_second or 0:,} tokens/s)")
    if summary.output:
        table.add_row("output", summary.output)
    stderr.print(table)
    if summary.mix is not None:
        stderr.print(mix_table(summary.mix))


def mix_table(mix: MixSummary) -> Table:
    """per source, the share asked for and the shares the rows hold, repeats, left out (a training mix's
    sources only: an eval split's name their sources and nothing else)."""
    table = Table(title=f"mix (by {mix.by}, seed {mix.seed})", title_justify="left")
    for name in ("source", "asked", "tokens", "trainable", "records", "epochs", "repeats", "left out"):
        table.add_column(name, justify="left" if name == "source" else "right")
    for s in mix.sources:
        if s.requested is None or s.realised is None or s.realised_share is None or s.left_out is None:
            continue
        kind, value = next(iter(s.requested.items()))
        asked = f"{value:g}x" if kind == "epochs" else f"{value:.1%}"
        real, share = s.realised, s.realised_share
        table.add_row(
            s.name,
            asked,
            f"{real['tokens']:,} ({share['tokens']:.1%})",
            f"{real['trainable_tokens']:,} ({share['trainable_tokens']:.1%})",
            f"{real['records']:,} ({share['records']:.1%})",
            f"{s.epochs or 0.0:.2f}",
            f"{s.repeats or 0:,}",
            f"{s.left_out['records']:,}",
        )
    return table


BAR_WIDTH = 32
TRAINED_STYLE = "bold green"
MASKED_STYLE = "dim"
IMAGE_STYLE = "magenta"  # an image's tokens, shown as one piece: <image 3: 28x40 patches, 280 tokens>
# Without colour (a pipe, NO_COLOR) trained runs are bracketed instead.
TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"


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


def print_row(result: Any) -> None:
    out = stdout
    marks = out.no_color or out.color_system is None
    header = (
        f"row {result.row} (rows 0..{result.rows - 1}; {result.shard}, row {result.row_in_shard}): "
        f"{result.tokens:,}/{result.max_len:,} tokens, {sum(not s.padding for s in result.segments)} samples, "
        f"{result.trained_tokens:,} trained"
    )
    out.print(Text(header, style="bold"), soft_wrap=True)
    if getattr(result, "reasoning", None) and result.reasoning.get("turns_left_out"):
        note = f"reasoning left out of the tokens (whole run): {reasoning_words(result.reasoning)}"
        out.print(Text(note, style="yellow"), soft_wrap=True)
    legend = Text("legend: ")
    legend.append(f"{TRAINED_OPEN}trained{TRAINED_CLOSE}" if marks else "trained", style=TRAINED_STYLE)
    legend.append("  ")
    legend.append("masked (label -100)", style=MASKED_STYLE)
    out.print(legend)
    for seg in result.segments:
        if seg.padding:
            out.rule(Text(f"padding: {seg.length:,} tokens (sample_index -1)", style=MASKED_STYLE), align="left")
            continue
        name = f"sample_index {seg.sample_index}" + (f" piece {seg.piece_index}" if seg.piece_index else "")
        if seg.role not in (None, "sft"):
            name += f" ({seg.role})"
        title = f"{name}: {seg.length:,} tokens, {seg.trained_tokens:,} trained"
        style = "bold yellow" if seg.sample_index == result.requested_sample_index else "bold"
        out.rule(Text(title, style=style), align="left")
        nodes = getattr(seg, "nodes", None) or []
        starts = [node["start"] for node in nodes] if len(nodes) > 1 else [0]
        at = 0
        body = Text()
        for piece in seg.pieces:
            if len(starts) > 1 and at in starts:  # a prefix tree: each node under its own heading
                if body:
                    out.print(body, soft_wrap=True)
                    body = Text()
                out.print(Text(_node_heading(starts.index(at), nodes[starts.index(at)]), style="bold"))
            at += piece.tokens
            if getattr(piece, "image", None) is not None:
                body.append(piece.text, style=IMAGE_STYLE)
            elif piece.trained:
                body.append(_bracketed(piece.text) if marks else piece.text, style=TRAINED_STYLE)
            else:
                body.append(piece.text, style=MASKED_STYLE)
        out.print(body, soft_wrap=True)
        if seg.shown_tokens < seg.length:
            more = seg.length - seg.shown_tokens
            out.print(Text(f"... {more:,} more tokens (--max-tokens {seg.shown_tokens})", style=MASKED_STYLE))


def _node_heading(index: int, node: dict[str, int]) -> str:
    last = node["position"] + node["length"] - 1
    parent = "root" if node["parent"] < 0 else f"branch of node {node['parent']}"
    return f"node {index} ({parent}): {node['length']:,} tokens, positions {node['position']}..{last}"


def _bracketed(text: str) -> str:
    # The closing mark goes before trailing newlines, so it stays on the line of the text it closes.
    core = text.rstrip("\n")
    return f"{TRAINED_OPEN}{core}{TRAINED_CLOSE}{text[len(core) :]}"
