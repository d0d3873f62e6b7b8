"""``--expand-turns``: one sample per round of a conversation, each trained on that round only.

Many chat templates render the reasoning of the last round only (Qwen3, GLM-4.5, Nemotron 3): trained as
one sample, the earlier rounds' answers are trained without the reasoning that produced them. Expanded,
a conversation of k rounds becomes k samples: sample r is the conversation up to the end of round r (its
last assistant message), trained on round r's trained assistant messages only, earlier rounds being
context. Each trained assistant message is so trained exactly once, rendered as the template renders a
last round. A round starts at a user message (the messages before the first one belong to the first
round) and holds the assistant messages and tool results up to the next user message.

``reasoning`` expands the conversations whose template leaves some trained turn's reasoning out;
``all`` every conversation with more than one round to train. The samples of a record share its
``sample_index`` and are numbered by round in ``piece_index``; what they cost in tokens beyond the whole
conversation (the context repeated) is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from packcli.errors import Opt, RecordError
from packcli.jsontypes import ChatMessage
from packcli.records.formats import Sample
from packcli.tokenize.chat_template import trained_turns

EXPANDED_KEYS = ("records", "samples", "extra_tokens")


def round_cuts(messages: list[ChatMessage], trained: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """Return each round's cut (the number of messages up to its last assistant message) and its trained turns.

    Rounds that train nothing are left out (they are context of the later ones).
    """
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user" and i > 0]
    bounds = list(zip([0, *starts], [*starts, len(messages)], strict=True))
    cuts = []
    for start, end in bounds:
        turns = tuple(i for i in trained if start <= i < end)
        if turns:
            cuts.append((turns[-1] + 1, turns))
    return cuts


def should_expand(mode: str, result: Any, cuts: list[tuple[int, tuple[int, ...]]]) -> bool:
    """Return whether an encoded conversation is expanded under ``--expand-turns mode``."""
    if len(cuts) < 2:
        return False
    if mode == "all":
        return True
    reasoning = getattr(result, "reasoning", None)
    return reasoning is not None and reasoning.left_out > 0


def round_samples(sample: Sample, cuts: list[tuple[int, tuple[int, ...]]]) -> list[Sample]:
    """Return the sample of each round: the messages up to its cut, trained on its turns only."""
    messages = sample.messages or []
    return [
        replace(
            sample,
            messages=messages[:cut],
            trained_turns=turns,
            message_train=None,
            prompt_len=None,
        )
        for cut, turns in cuts
    ]


class Rounds(list[Any]):
    """The (input_ids, labels) of an expanded record's rounds, in order (``piece_index`` is the round)."""

    whole_tokens: int = 0  # the tokens of the conversation as one sample


@dataclass
class Expansion:
    """What ``expand`` did to a batch: its results (an expanded record's a ``Rounds``) and the counts."""

    results: list[Any]
    records: int = 0
    samples: int = 0
    extra_tokens: int = 0

    def counts(self) -> dict[str, int]:
        if not self.records:
            return {}
        return {"records": self.records, "samples": self.samples, "extra_tokens": self.extra_tokens}


def expand(encoder: Any, samples: list[Any], results: list[Any], mode: str) -> Expansion:
    """Return the batch's results with each conversation to expand replaced by its rounds' (see the module doc).

    A round that cannot be encoded refuses its record with that round's reason.
    """
    out = Expansion(list(results))
    for k, (sample, result) in enumerate(zip(samples, results, strict=True)):
        if not isinstance(sample, Sample) or sample.kind != "chat" or not isinstance(result, tuple):
            continue
        messages = sample.messages or []
        cuts = round_cuts(messages, trained_turns(sample, encoder.options.train_on))
        if not should_expand(mode, result, cuts):
            continue
        made = encoder.encode_batch(round_samples(sample, cuts))
        failed = [(r, m) for r, m in enumerate(made) if isinstance(m, RecordError)]
        if failed:
            at, error = failed[0]
            out.results[k] = RecordError(error.reason, f"round {at} (", Opt("expand_turns"), "): ", *error.parts)
            continue
        rounds = Rounds(made)
        rounds.whole_tokens = len(result[0])
        out.results[k] = rounds
        out.records += 1
        out.samples += len(made)
        out.extra_tokens += sum(len(ids) for ids, _ in made) - len(result[0])
    return out


REASONING_KEYS = ("turns", "turns_left_out", "records_left_out", "records_last_round_only")


def reasoning_counts(results: list[Any]) -> dict[str, int]:
    """Return the reasoning of the encoded conversations' trained turns, counted (empty when none has any).

    ``turns``: trained turns with reasoning; ``turns_left_out``: those whose reasoning the template leaves
    out of the tokens; ``records_left_out``: conversations with such a turn; ``records_last_round_only``:
    those where the template keeps only the last round's reasoning.
    """
    flat = [x for r in results for x in (r if isinstance(r, Rounds) else [r])]
    found = [r.reasoning for r in flat if getattr(r, "reasoning", None) is not None]
    if not found:
        return {}
    return {
        "turns": sum(r.turns for r in found),
        "turns_left_out": sum(r.left_out for r in found),
        "records_left_out": sum(r.left_out > 0 for r in found),
        "records_last_round_only": sum(r.last_only for r in found),
    }
