"""Preference records (DPO, reward modelling, KTO) as the samples a packed row holds.

A ``preference`` record (TRL's format: ``prompt``, ``chosen``, ``rejected``, each a string or a list of
messages; or ``chosen`` and ``rejected`` alone, whole conversations sharing their first messages, the
"implicit prompt" form) becomes two samples, chosen then rejected: prompt + chosen and prompt +
rejected, each normalised as a ``prompt_completion`` record is (strings are encoded as text, message
lists rendered by the chat template), so the same span rule decides what is trained: the completion.
A ``kto`` record (``prompt``, ``completion``, ``label`` a boolean) becomes one sample, desirable when
the label is true.

The samples of a record share its ``sample_index``; ``piece_index`` numbers them (0 chosen, 1
rejected) and ``sample_role`` says what each is (``packcli.contract.SAMPLE_ROLES``). The plan keeps a
record's samples in one row, adjacent, as one item of their summed length (``packcli.plan.pairs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packcli.contract import CHOSEN, DESIRABLE, REJECTED, SAMPLE_ROLES, UNDESIRABLE
from packcli.errors import Opt, RecordError
from packcli.records.formats import PREFERENCE_FORMATS, Sample, normalize

PAIR_ROLES = (CHOSEN, REJECTED)
TASK_OF_FORMAT = {"preference": "preference", "kto": "kto"}


@dataclass(frozen=True)
class Members:
    """The samples one preference or KTO record becomes, in row order, with their roles."""

    samples: tuple[Sample, ...]
    roles: tuple[int, ...]


def task_of(fmt: str | None) -> str:
    """Return the task a record format trains (``sft`` for every format but preference and kto)."""
    return TASK_OF_FORMAT.get(fmt or "", "sft")


def normalize_members(record: Any, fmt: str, fields: dict[str, str]) -> Members:
    """Return the samples of a ``preference`` or ``kto`` record; raise RecordError naming what is wrong."""
    assert fmt in PREFERENCE_FORMATS
    if not isinstance(record, dict):
        raise RecordError("not_an_object", f"the record is a {type(record).__name__}, not a JSON object")
    if fmt == "kto":
        label = record.get(fields["label"])
        if fields["label"] not in record:
            raise RecordError("missing_field", f"the record has no field '{fields['label']}' (KTO needs true or false)")
        if isinstance(label, str) and label.strip().lower() in ("true", "false"):
            label = label.strip().lower() == "true"  # CSV cells are text
        if not isinstance(label, bool):
            raise RecordError("wrong_type", f"field '{fields['label']}' must be true or false, not {_tname(label)}")
        sample = normalize(record, "prompt_completion", fields)
        return Members((sample,), (DESIRABLE if label else UNDESIRABLE,))
    for key in (fields["chosen"], fields["rejected"]):
        if key not in record:
            raise RecordError(
                "missing_field", f"the record has no field '{key}' (it has: {', '.join(map(str, record))})"
            )
        if record[key] is None:
            raise RecordError("wrong_type", f"field '{key}' is null")
    chosen, rejected = record[fields["chosen"]], record[fields["rejected"]]
    if fields["prompt"] in record and record[fields["prompt"]] is not None:
        prompt = record[fields["prompt"]]
        if chosen == rejected:  # as the implicit form's identical conversations: nothing to prefer
            raise RecordError("identical_completions", f"'{fields['chosen']}' and '{fields['rejected']}' are the same")
    else:
        prompt, chosen, rejected = _implicit_prompt(chosen, rejected, fields)
    samples = []
    for key, completion in ((fields["chosen"], chosen), (fields["rejected"], rejected)):
        pc = {**record, fields["prompt"]: prompt, fields["completion"]: completion}
        try:
            samples.append(normalize(pc, "prompt_completion", fields))
        except RecordError as err:
            # Name the field the user wrote, not the prompt/completion pair it was read as.
            named = f"'{fields['completion']}'", f"'{key}'"
            raise RecordError(err.reason, *(p.replace(*named) if isinstance(p, str) else p for p in err.parts)) from err
    if samples[0].kind != samples[1].kind:
        raise RecordError(
            "wrong_type",
            f"fields '{fields['chosen']}' and '{fields['rejected']}' must both be strings or both message lists",
        )
    return Members(tuple(samples), PAIR_ROLES)


def _implicit_prompt(chosen: Any, rejected: Any, fields: dict[str, str]) -> tuple[Any, Any, Any]:
    """Split two whole conversations into their shared first messages (the prompt) and the rest."""
    c_name, r_name = fields["chosen"], fields["rejected"]
    if not isinstance(chosen, list) or not isinstance(rejected, list):
        raise RecordError(
            "missing_field",
            f"the record has no field '{fields['prompt']}': '{c_name}' and '{r_name}' without a prompt must be "
            "whole conversations (message lists) sharing their first messages",
        )
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == len(chosen) or shared == len(rejected):
        raise RecordError(
            "identical_completions", f"'{c_name}' and '{r_name}' do not differ after their shared messages"
        )
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _tname(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def encode(encoder: Any, items: list[Any]) -> list[Any]:
    """Encode a batch whose items are Samples, RecordErrors or Members, in one call of the encoder.

    Returns, per item, what ``Encoder.encode_batch`` returns for a Sample, or for Members a list of
    (input_ids, labels, role) in row order, or the RecordError of the first member that fails (its
    detail names the member).
    """
    flat: list[Any] = []
    owner: list[int] = []
    for k, item in enumerate(items):
        for sample in item.samples if isinstance(item, Members) else (item,):
            flat.append(sample)
            owner.append(k)
    results = encoder.encode_batch(flat)
    out: list[Any] = [None] * len(items)
    at = 0
    for k, item in enumerate(items):
        if not isinstance(item, Members):
            out[k] = results[at]
            at += 1
            continue
        members = results[at : at + len(item.samples)]
        at += len(item.samples)
        failed = [(r, role) for r, role in zip(members, item.roles, strict=True) if isinstance(r, RecordError)]
        if failed:
            err, role = failed[0]
            out[k] = RecordError(err.reason, f"{SAMPLE_ROLES[role]}: ", *err.parts) if len(item.roles) > 1 else err
        else:
            out[k] = [(ids, labels, role) for (ids, labels), role in zip(members, item.roles, strict=True)]
    return out


def resolve_task(
    task: str, formats: dict[str, str | None], overflow: str, output_format: str, truncate_side: str = "auto"
) -> tuple[str, dict[str, str | None]]:
    """Return the task of a run and the inputs' formats as that task reads them.

    ``task`` is --task: ``auto`` takes it from the formats detected (inputs of different tasks are
    refused); ``sft`` reads KTO-looking records as prompt/completion (the label is ignored); ``kto``
    reads prompt/completion records as KTO (each must then have a boolean label); ``preference``
    needs chosen/rejected records. Raise UsageError or InputError in one line naming the input.
    """
    from packcli.errors import InputError, UsageError

    out = dict(formats)
    if task == "sft":
        for path, fmt in formats.items():
            if fmt == "preference":
                raise UsageError(
                    f"{path}: preference records (chosen/rejected) cannot be packed with ",
                    Opt("task", "sft"),
                    hint=("drop ", Opt("task"), " or pass ", Opt("task", "preference")),
                )
            if fmt == "kto":
                out[path] = "prompt_completion"
    elif task in ("preference", "kto"):
        for path, fmt in formats.items():
            if task == "kto" and fmt == "prompt_completion":
                out[path] = fmt = "kto"
            if fmt is not None and fmt != task:
                fields = "prompt, chosen, rejected" if task == "preference" else "prompt, completion, label"
                raise InputError(
                    f"{path}: ",
                    Opt("task", task),
                    f" needs records with {fields}, and these are {fmt} records",
                    hint=("check the input or pass ", Opt("fields"), " to name the fields"),
                )
    else:
        found = {path: task_of(fmt) for path, fmt in formats.items() if fmt is not None}
        tasks = sorted(set(found.values()))
        if len(tasks) > 1:
            named = ", ".join(f"{next(p for p, t in found.items() if t == k)} is {k}" for k in tasks)
            raise InputError(f"the inputs mix tasks ({named}); pack each task into its own output")
        task = tasks[0] if tasks else "sft"
    if task != "sft" and overflow == "split":
        raise UsageError(
            Opt("overflow", "split"),
            f" does not apply to {task} data: a record's samples are packed whole, never split",
            hint=("pass ", Opt("overflow", "truncate"), " (cuts the prompt from the left) or drop"),
        )
    if task != "sft" and truncate_side == "right":
        # Cutting a pair's answers would compare truncated answers; its prompt is cut instead, from the left.
        raise UsageError(
            Opt("truncate_side", "right"),
            f" does not apply to {task} data: a record is cut only in its prompt, from the "
            "left, so that its answers stay whole",
            hint=("leave ", Opt("truncate_side"), " out"),
        )
    if task != "sft" and output_format == "megatron":
        raise UsageError(
            Opt("output_format", "megatron"), f" holds SFT samples only, not {task} data; write parquet, arrow or mds"
        )
    return task, out
