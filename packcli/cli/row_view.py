"""One packed row as ``packcli inspect`` shows it on stdout (``print_row``): its samples in turn, trained
tokens in colour (bracketed without colour), masked ones dim, images and prefix-tree nodes named; or one
input record's samples alone, each under its row and offset (``print_sample``, ``--sample-index``).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from packcli.cli.consoles import stdout
from packcli.cli.pack_summary import reasoning_words

TRAINED_STYLE = "bold green"
MASKED_STYLE = "dim"
IMAGE_STYLE = "magenta"  # an image's tokens, shown as one piece: <image 3: 28x40 patches, 280 tokens>
# Without colour (a pipe, NO_COLOR) trained runs are bracketed instead.
TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"


def print_row(result: Any) -> None:
    out = stdout
    header = (
        f"row {result.row} (rows 0..{result.rows - 1}; {result.shard}, row {result.row_in_shard}): "
        f"{result.tokens:,}/{result.max_len:,} tokens, {sum(not s.padding for s in result.segments)} samples, "
        f"{result.trained_tokens:,} trained"
    )
    marks = _print_head(header, result)
    for seg in result.segments:
        if seg.padding:
            out.rule(Text(f"padding: {seg.length:,} tokens (sample_index -1)", style=MASKED_STYLE), align="left")
            continue
        style = "bold yellow" if seg.sample_index == result.requested_sample_index else "bold"
        _print_segment(seg, _segment_title(seg), style, marks)


def print_sample(result: Any) -> None:
    """An input record's samples alone (``inspect --sample-index``), each under its row and offset."""
    found = result.occurrences
    if len(found) == 1:
        first = found[0]
        where = (
            f"(not the rest of its row): row {first.row} at token {first.offset} (rows 0..{result.rows - 1}; "
            f"{first.shard}, row {first.row_in_shard}); --row {first.row} shows the whole row"
        )
    else:
        places = [f"row {o.row} at token {o.offset}" for o in found]
        if len(places) > 6:  # the header stays one line; each sample's heading names its place
            places = [*places[:5], f"{len(places) - 5} more"]
        where = (
            f"(not the rest of its rows): {len(found)} occurrences, {', '.join(places[:-1])} and {places[-1]} "
            f"(rows 0..{result.rows - 1}); --row N shows a whole row"
        )
    marks = _print_head(f"sample_index {result.sample_index} only {where}", result)
    for occurrence in found:
        seg = occurrence.segment
        title = f"row {occurrence.row} at token {occurrence.offset}: {_segment_title(seg)}"
        _print_segment(seg, title, "bold yellow", marks)


def _print_head(header: str, result: Any) -> bool:
    """Print the header line, the reasoning note and the legend; return whether trained runs are bracketed."""
    out = stdout
    marks = out.no_color or out.color_system is None
    out.print(Text(header, style="bold"), soft_wrap=True)
    if getattr(result, "reasoning", None) and result.reasoning.get("turns_left_out"):
        note = f"reasoning left out of the tokens (whole run): {reasoning_words(result.reasoning)}"
        out.print(Text(note, style="yellow"), soft_wrap=True)
    legend = Text("legend: ")
    legend.append(f"{TRAINED_OPEN}trained{TRAINED_CLOSE}" if marks else "trained", style=TRAINED_STYLE)
    legend.append("  ")
    legend.append("masked (label -100)", style=MASKED_STYLE)
    out.print(legend)
    return bool(marks)


def _segment_title(seg: Any) -> str:
    name = f"sample_index {seg.sample_index}" + (f" piece {seg.piece_index}" if seg.piece_index else "")
    if seg.role not in (None, "sft"):
        name += f" ({seg.role})"
    return f"{name}: {seg.length:,} tokens, {seg.trained_tokens:,} trained"


def _print_segment(seg: Any, title: str, style: str, marks: bool) -> None:
    """Print one sample under its title: trained, masked and image pieces, each tree node under a heading."""
    out = stdout
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
