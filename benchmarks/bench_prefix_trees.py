"""Tokens of per-round expansions stored as prefix trees, against the plain expansion.

Synthetic agent traces, seeded: a tools and system prefix of ``--prefix`` tokens, then ``--rounds``
rounds, each an untrained turn (the user's message, or the last tool's result) and a trained
assistant turn (reasoning, then an answer or a tool call). As templates that keep only the last
round's reasoning render them, round j's expanded sample is the prefix, the earlier rounds without
their reasoning (untrained) and round j in full (trained). Token ids are random: only the lengths
matter, and they are drawn per round from the ranges below.

Prints, over ``--traces`` traces: the tokens of one sample per conversation (what training without
the expansion reads, with only the last round's reasoning), of the plain expansion (one sample per
round), and of the trees (packcli.tokenize.trees.build_tree), the trained tokens of each (equal for
the expansion and the trees), and the builder's time per trace.

    python benchmarks/bench_prefix_trees.py --traces 200 --rounds 5 --prefix 1500
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from packcli.tokenize.trees import build_tree

# Token ranges per round (low, high), drawn uniformly; options change them.
TURN = (40, 400)  # the user's message or a tool's result
REASONING = (150, 600)
ANSWER = (30, 250)  # the answer or the tool call
Span = tuple[int, int]


def trace(
    rng: np.random.Generator, rounds: int, prefix: int, spans: tuple[Span, Span, Span] = (TURN, REASONING, ANSWER)
) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Return one trace's expanded samples and the length of the conversation rendered once."""
    vocab = 100_000

    def draw(span: tuple[int, int]) -> list[int]:
        return rng.integers(1, vocab, int(rng.integers(span[0], span[1] + 1))).tolist()

    tools = draw((prefix, prefix))
    history: list[int] = []
    samples = []
    for _ in range(rounds):
        turn, reasoning, answer = (draw(span) for span in spans)
        ids = [*tools, *history, *turn, *reasoning, *answer]
        trained = [False] * (len(tools) + len(history) + len(turn)) + [True] * (len(reasoning) + len(answer))
        samples.append((np.asarray(ids, dtype=np.int32), np.asarray(trained, dtype=bool)))
        history += [*turn, *answer]  # a past round keeps its answer, not its reasoning
        last = len(ids)
    return samples, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefix", type=int, default=1500, help="tokens of the tools list and system prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--collate", action="store_true", help="also time PackedCollator('padded') on tree rows")
    for name, span in (("turn", TURN), ("reasoning", REASONING), ("answer", ANSWER)):
        parser.add_argument(f"--{name}", default=f"{span[0]},{span[1]}", help="tokens per round: LOW,HIGH")
    args = parser.parse_args()
    spans = tuple(tuple(int(v) for v in getattr(args, n).split(",")) for n in ("turn", "reasoning", "answer"))
    rng = np.random.default_rng(args.seed)
    conversation = expansion = tree_tokens = trained = tree_trained = 0
    seconds = []
    ratios = []
    for _ in range(args.traces):
        samples, once = trace(rng, args.rounds, args.prefix, spans)  # type: ignore[arg-type]
        start = time.perf_counter()
        tree = build_tree(samples)
        seconds.append(time.perf_counter() - start)
        expanded = sum(len(ids) for ids, _ in samples)
        conversation += once
        expansion += expanded
        tree_tokens += len(tree)
        trained += sum(int(mask.sum()) for _, mask in samples)
        tree_trained += int(tree.trained.sum())
        ratios.append(len(tree) / expanded)
    print(
        f"{args.traces} traces of {args.rounds} rounds, a {args.prefix}-token prefix, per round turn {args.turn}, "
        f"reasoning {args.reasoning}, answer {args.answer} tokens (seed {args.seed})"
    )
    print(f"conversation rendered once: {conversation:,} tokens")
    print(f"plain expansion:            {expansion:,} tokens, {trained:,} trained")
    print(f"prefix trees:               {tree_tokens:,} tokens, {tree_trained:,} trained")
    print(
        f"trees / expansion: {tree_tokens / expansion:.3f} (per trace: min {min(ratios):.3f}, "
        f"median {statistics.median(ratios):.3f}, max {max(ratios):.3f}); "
        f"trees / conversation: {tree_tokens / conversation:.3f}"
    )
    per_trace = expansion // args.traces
    print(f"build_tree: median {statistics.median(seconds) * 1e3:.1f} ms per trace ({per_trace:,} tokens)")
    if args.collate:
        _time_collate(rng, args, spans)  # type: ignore[arg-type]


def _time_collate(rng: np.random.Generator, args: argparse.Namespace, spans: tuple[Span, Span, Span]) -> None:
    """Time the padded collator's 4-D mask on batches of two rows, one tree sample per row."""
    import torch

    from packcli.train.collate import PackedCollator

    collators = {"float32": PackedCollator("padded"), "bool": PackedCollator("padded", mask_dtype=torch.bool)}
    seconds: dict[str, list[float]] = {name: [] for name in collators}
    width = 0
    for _ in range(5):
        rows = []
        for _ in range(2):
            tree = build_tree(trace(rng, args.rounds, args.prefix, spans)[0])
            rows.append(
                {
                    "input_ids": tree.ids,
                    "labels": np.where(tree.trained, tree.ids, -100),
                    "position_ids": tree.positions,
                    "seq_lengths": [len(tree)],
                    "tree_node_lengths": tree.node_lengths,
                    "tree_node_parents": tree.node_parents,
                }
            )
        for name, collate in collators.items():
            start = time.perf_counter()
            batch = collate(rows)
            seconds[name].append(time.perf_counter() - start)
            width = max(width, batch["input_ids"].shape[1])
    for name, size in (("float32", 4), ("bool", 1)):
        print(
            f"PackedCollator('padded'), 2 tree rows, {name} mask: median {statistics.median(seconds[name]) * 1e3:.0f} "
            f"ms (T up to {width:,}; {2 * width * width * size / 2**20:,.0f} MiB)"
        )


if __name__ == "__main__":
    main()
