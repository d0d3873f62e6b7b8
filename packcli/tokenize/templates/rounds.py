"""``--expand-turns``: one sample per round of a conversation, each trained on that round only.

Many chat templates render the reasoning of the last round only (Qwen3, GLM-4.5, Nemotron 3): trained as
one sample, the earlier rounds' answers are trained without the reasoning that produced them. Expanded,
a conversation of k rounds becomes k samples: sample r is the conversation up to the end of round r (its
last assistant message), trained on round r's trained assistant messages only, earlier rounds being
context. Each trained assistant message is so trained exactly once, rendered as the template renders a
last round. A round starts at a user message (the messages before the first one belong to the first
round) and holds the assistant messages and tool results up to the next user message. Where a later
message of a round makes the template leave out an earlier one's reasoning (gpt-oss drops a call's
analysis once a final answer follows), the round is cut after that message too: it ends a sample of its
own, in which its reasoning is rendered.

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
from packcli.tokenize.templates.chat_template import trained_turns

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
    """Return the batch's results with each conversation to expand replaced by its samples (see the module doc).

    A sample that cannot be encoded refuses its record with that sample's reason.
    """
    out = Expansion(list(results))
    for k, (sample, result) in enumerate(zip(samples, results, strict=True)):
        if not isinstance(sample, Sample) or sample.kind != "chat" or not isinstance(result, tuple):
            continue
        cuts = round_cuts(sample.messages or [], trained_turns(sample, encoder.options.train_on))
        reasoning = getattr(result, "reasoning", None)
        left = reasoning is not None and reasoning.left_out > 0
        if not left and (mode != "all" or len(cuts) < 2):
            continue
        made = _cut(encoder, sample, cuts)
        if isinstance(made, RecordError):
            out.results[k] = made
            continue
        if len(made) < 2:  # one round, and no cut inside it keeps what the whole leaves out
            continue
        rounds = Rounds(made)
        rounds.whole_tokens = len(result[0])
        out.results[k] = rounds
        out.records += 1
        out.samples += len(made)
        out.extra_tokens += sum(len(ids) for ids, _ in made) - len(result[0])
    return out


def _cut(encoder: Any, sample: Sample, cuts: list[tuple[int, tuple[int, ...]]]) -> list[Any] | RecordError:
    """Return the encoded samples of a conversation's rounds, each round cut again where it must be.

    A round is cut after an assistant message whose reasoning a later message of the round makes the
    template leave out (gpt-oss drops a call's analysis once a final answer follows): that message ends
    a sample of its own, trained on the round's messages up to it, where its reasoning is rendered; the
    rest of the round is trained in the round's sample. Not where the message's reasoning is left out
    even at the end of a sample (a template that renders none): no cut would keep it.
    """
    made: list[Any] = []
    encoded = encoder.encode_batch(round_samples(sample, cuts))
    pending = [(cut, turns, result) for (cut, turns), result in zip(cuts, encoded, strict=True)]
    while pending:
        cut, turns, result = pending.pop(0)
        if isinstance(result, RecordError):
            n = len(made)
            return RecordError(result.reason, f"sample {n} (", Opt("expand_turns"), "): ", *result.parts)
        reasoning = getattr(result, "reasoning", None)
        earlier = [i for i in (reasoning.left if reasoning is not None else ()) if i != turns[-1]]
        if earlier:
            at = max(earlier)
            head = tuple(i for i in turns if i <= at)
            tail = tuple(i for i in turns if i > at)
            first, rest = encoder.encode_batch(round_samples(sample, [(at + 1, head), (cut, tail)]))
            kept = not isinstance(first, RecordError) and at not in _left(first)
            if kept or isinstance(first, RecordError):
                pending[:0] = [(at + 1, head, first), (cut, tail, rest)]
                continue
        made.append(result)
    return made


def _left(result: Any) -> tuple[int, ...]:
    reasoning = getattr(result, "reasoning", None)
    return reasoning.left if reasoning is not None else ()


REASONING_KEYS = ("turns", "turns_left_out", "records_left_out", "records_last_round_only", "empty_think")


def reasoning_counts(results: list[Any]) -> dict[str, int]:
    """Return the reasoning of the encoded conversations' trained turns, counted (empty when none has any).

    ``turns``: trained turns with reasoning; ``turns_left_out``: those whose reasoning the template leaves
    out of the tokens; ``records_left_out``: conversations with such a turn; ``records_last_round_only``:
    those where the template keeps only the last round's reasoning; ``empty_think``: trained answers
    without reasoning in which the template writes an empty think block (Qwen3's last answer). An
    expanded record counts once, by what its samples leave out (what the expansion could not keep).
    """
    found = []
    for result in results:
        parts = result if isinstance(result, Rounds) else [result]
        own = [r.reasoning for r in parts if getattr(r, "reasoning", None) is not None]
        if own:
            found.append(own)
    if not found:
        return {}
    return {
        "turns": sum(r.turns for own in found for r in own),
        "turns_left_out": sum(r.left_out for own in found for r in own),
        "records_left_out": sum(any(r.left_out for r in own) for own in found),
        "records_last_round_only": sum(any(r.last_only for r in own) for own in found),
        "empty_think": sum(r.empty_think for own in found for r in own),
    }
