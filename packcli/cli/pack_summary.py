"""The table of a pack run's summary on stderr (``print_pack_summary``), with its mix table, and the words
of its cells that ``packcli stats`` and ``packcli inspect`` show too (``reasoning_words``).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from packcli.cli.consoles import stderr
from packcli.results import EncoderInfo, MixSummary, RunSummary, StepBalance


def reasoning_words(reasoning: dict[str, int]) -> str:
    """Return the reasoning count of a summary as one table cell: "2 of 3 turns (1 record)"."""
    records, empty = reasoning["records_left_out"], reasoning.get("empty_think", 0)
    plural = "s" * (records != 1)
    words = f"{reasoning['turns_left_out']:,} of {reasoning['turns']:,} turns ({records:,} record{plural})"
    return words + (f"; {empty:,} empty think block{'s' * (empty != 1)} trained" if empty else "")


def step_idle_words(steps: StepBalance) -> str:
    """Return the steps' idle fraction as one table cell: as written, then with the steps by tokens and by cost."""
    by_tokens = "?" if steps.idle_tokens is None else f"{steps.idle_tokens:.2%}"
    return f"{steps.idle:.2%} (steps by tokens {by_tokens}, by cost {steps.idle_compute:.2%}; model {steps.model})"


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
    if summary.step_balance is not None:
        table.add_row(f"idle at steps ({summary.step_balance.balance})", step_idle_words(summary.step_balance))
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
