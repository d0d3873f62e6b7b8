"""DPO and KTO on packed preference shards: the loss of a packed batch is the loss of its pairs run alone.

A tiny Llama (random weights) runs real shards written by the CLI. Every chosen and rejected sample's
summed log-probability computed inside packed rows (one forward pass, sdpa and eager, position_ids or
a 4-D block mask) equals the one computed with the sample alone, to 1e-5 relative, and so does the
DPO loss of the batch. Without position_ids the samples see each other and the values move.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM
from typer.testing import CliRunner

from packcli.cli import app
from packcli.train.collate import IGNORE_INDEX
from packcli.train.dpo import (
    PreferenceCollator,
    block_causal_mask,
    dpo_loss,
    kto_loss,
    pair_logps,
    reward_loss,
    sequence_logps,
    sequence_logps_from_hidden,
)

from .conftest import read_rows, write_jsonl
from .test_preference import kto_records, preference_records
from .test_trainer import _tiny_model

MAX_LEN = 512
REL_TOL = 1e-5
LEAK = 1e-3  # a sample that attends to another moves its log-probability by more than this (relative)
IMPLS = ["sdpa", "eager"]


def _pack(records: list[dict[str, Any]], out: Path) -> list[dict[str, Any]]:
    data = write_jsonl(out.with_suffix(".jsonl"), records)
    args = ["pack", str(data), "--max-len", str(MAX_LEN), "-o", str(out), "--no-cache", "--num-proc", "1", "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return read_rows(out)


@pytest.fixture(scope="module")
def pref_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    rows = _pack(preference_records(16, seed=23), tmp_path_factory.mktemp("dpo") / "pref")
    assert max(len(r["seq_lengths"]) for r in rows) >= 6, "rows should hold several pairs"
    return rows


@pytest.fixture(scope="module")
def kto_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    rows = _pack(kto_records(16, seed=29), tmp_path_factory.mktemp("kto") / "kto")
    assert max(len(r["seq_lengths"]) for r in rows) >= 4
    return rows


def _vocab() -> int:
    from transformers import AutoTokenizer

    from packcli.tokenize.encoders.tokenizer import default_tokenizer_dir

    return len(AutoTokenizer.from_pretrained(default_tokenizer_dir()))


@pytest.fixture(scope="module")
def vocab_size() -> int:
    return _vocab()


def _tiny(vocab_size: int, impl: str, seed: int) -> LlamaForCausalLM:
    # Wide weights keep the attention sharp, so that a sample seeing another moves its values clearly.
    return _tiny_model(vocab_size, impl, initializer_range=1.0, seed=seed, max_positions=2 * MAX_LEN).eval()


Alone = dict[tuple[int, int], tuple[float, int]]


@pytest.fixture(scope="module", params=IMPLS)
def models(
    request: pytest.FixtureRequest, vocab_size: int, pref_rows: list[dict[str, Any]]
) -> tuple[LlamaForCausalLM, LlamaForCausalLM, Alone, Alone]:
    """The policy and the reference model (another initialisation), and each sample's values alone under both."""
    policy, reference = _tiny(vocab_size, request.param, seed=0), _tiny(vocab_size, request.param, seed=1)
    return policy, reference, _alone(policy, pref_rows), _alone(reference, pref_rows)


def _alone(model: LlamaForCausalLM, rows: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[float, int]]:
    """Each sample run by itself (positions 0..n-1): its summed log-probability of trained tokens, and their count.

    Computed here directly, without packcli's helpers, by (sample_index, role).
    """
    out = {}
    with torch.no_grad():
        for row in rows:
            start = 0
            for n, index, role in zip(row["seq_lengths"], row["sample_index"], row["sample_role"], strict=True):
                ids = torch.tensor(row["input_ids"][start : start + n])[None]
                labels = torch.tensor(row["labels"][start : start + n])
                hidden = model.model(input_ids=ids, position_ids=torch.arange(n)[None], use_cache=False)
                hidden = hidden.last_hidden_state[0]
                trained = torch.nonzero(labels[1:] != IGNORE_INDEX).reshape(-1)
                logits = model.lm_head(hidden[trained])
                logp = -F.cross_entropy(logits, labels[1:][trained], reduction="sum")
                out[(index, role)] = (float(logp), len(trained))
                start += n
    return out


def _packed(
    model: LlamaForCausalLM, batch: dict[str, Any], positions: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    segments = batch["segments"]
    inputs = {"input_ids": batch["input_ids"]}
    if positions:
        inputs["position_ids"] = batch["position_ids"]
    if "attention_mask" in batch:
        inputs["attention_mask"] = batch["attention_mask"]
    with torch.no_grad():
        hidden = model.model(**inputs, use_cache=False).last_hidden_state
        return sequence_logps_from_hidden(hidden, model.lm_head, batch["labels"], segments)


def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a - b).abs() / b.abs()).max()


def _expected(alone: dict[tuple[int, int], tuple[float, int]], segments: Any) -> tuple[torch.Tensor, torch.Tensor]:
    keys = list(zip(segments.sample_index.tolist(), segments.role.tolist(), strict=True))
    return (
        torch.tensor([alone[k][0] for k in keys], dtype=torch.float32),
        torch.tensor([alone[k][1] for k in keys], dtype=torch.long),
    )


@pytest.mark.parametrize(
    "layout",
    [("padded", False), ("flatten", False), ("padded", True)],
    ids=["padded-positions", "flatten-positions", "padded-4d-mask"],
)
def test_packed_logps_and_dpo_loss_equal_alone(
    layout: tuple[str, bool], models: tuple[Any, ...], pref_rows: list[dict[str, Any]]
) -> None:
    mode, mask = layout
    policy, reference, alone_policy, alone_reference = models
    batch = PreferenceCollator(mode, attention_mask=mask)(pref_rows)
    segments = batch["segments"]
    assert segments.num_pairs == 16
    policy_logps, counts = _packed(policy, batch)
    reference_logps, _ = _packed(reference, batch)
    want, want_counts = _expected(alone_policy, segments)
    assert torch.equal(counts, want_counts)
    assert _rel(policy_logps, want) <= REL_TOL
    want_ref, _ = _expected(alone_reference, segments)
    assert _rel(reference_logps, want_ref) <= REL_TOL
    # The DPO loss of the packed batch is the mean over pairs of the pairs' losses alone.
    loss, chosen_rewards, rejected_rewards = dpo_loss(
        *pair_logps(policy_logps, segments), *pair_logps(reference_logps, segments), beta=0.1
    )
    pc, pr = pair_logps(want, segments)
    rc, rr = pair_logps(want_ref, segments)
    margins = 0.1 * ((pc - rc) - (pr - rr))
    alone_loss = -F.logsigmoid(margins).mean()
    assert abs(float(loss) - float(alone_loss)) <= REL_TOL * abs(float(alone_loss))
    assert torch.allclose(chosen_rewards - rejected_rewards, margins, rtol=1e-4, atol=1e-4)


def test_without_position_ids_the_samples_see_each_other(
    models: tuple[Any, ...], pref_rows: list[dict[str, Any]]
) -> None:
    """The negative control: no position_ids and no mask, so every sample attends to those before it."""
    policy, _, alone, _ = models
    batch = PreferenceCollator("padded")(pref_rows)
    segments = batch["segments"]
    leaked, _ = _packed(policy, batch, positions=False)
    want, _ = _expected(alone, segments)
    first = segments.start == 0  # a row's first sample sees nothing before it; the others do
    assert _rel(leaked[first], want[first]) <= REL_TOL
    assert ((leaked[~first] - want[~first]).abs() / want[~first].abs()).min() > LEAK


def test_loss_is_per_pair_not_per_token() -> None:
    """Two pairs of very different lengths weigh the same in the DPO loss (the mean of their losses)."""
    policy = torch.tensor([-10.0, -12.0, -400.0, -390.0])  # chosen, rejected, chosen, rejected
    reference = torch.tensor([-11.0, -11.0, -395.0, -395.0])
    loss, _, _ = dpo_loss(policy[0::2], policy[1::2], reference[0::2], reference[1::2], beta=0.5)
    per_pair = [-F.logsigmoid(torch.tensor(0.5 * ((-10 + 11) - (-12 + 11)))), -F.logsigmoid(torch.tensor(-5.0))]
    assert torch.isclose(loss, (per_pair[0] + per_pair[1]) / 2)
    assert torch.isclose(
        dpo_loss(policy[0::2], policy[1::2], reference[0::2], reference[1::2], 0.5, num_pairs=4)[0], loss / 2
    )
    assert torch.isclose(
        reward_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0])),
        -(F.logsigmoid(torch.tensor(1.0)) + F.logsigmoid(torch.tensor(0.0))) / 2,
    )


def test_kto_logps_and_loss_equal_alone(vocab_size: int, kto_rows: list[dict[str, Any]]) -> None:
    policy, reference = _tiny(vocab_size, "sdpa", seed=0), _tiny(vocab_size, "sdpa", seed=1)
    batch = PreferenceCollator("padded")(kto_rows)
    segments = batch["segments"]
    assert len(segments.kto) == 16 and segments.num_pairs == 0
    assert segments.desirable.tolist() == [i % 3 != 0 for i in segments.sample_index.tolist()]
    policy_logps, _ = _packed(policy, batch)
    reference_logps, _ = _packed(reference, batch)
    want, _ = _expected(_alone(policy, kto_rows), segments)
    want_ref, _ = _expected(_alone(reference, kto_rows), segments)
    assert _rel(policy_logps, want) <= REL_TOL
    loss, rewards = kto_loss(policy_logps[segments.kto], reference_logps[segments.kto], segments.desirable, kl=0.5)
    r = 0.1 * (want - want_ref)
    z = 0.1 * 0.5
    alone = torch.where(segments.desirable, 1 - torch.sigmoid(r - z), 1 - torch.sigmoid(z - r)).mean()
    assert abs(float(loss) - float(alone)) <= REL_TOL * float(alone)
    assert torch.allclose(rewards, r, rtol=1e-4, atol=1e-5)


def test_full_logits_and_hidden_states_agree(vocab_size: int, pref_rows: list[dict[str, Any]]) -> None:
    policy = _tiny(vocab_size, "sdpa", seed=0)
    batch = PreferenceCollator("flatten")(pref_rows[:2])
    with torch.no_grad():
        out = policy(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
        hidden = policy.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    a, na = sequence_logps(out.logits, batch["labels"], batch["segments"])
    b, nb = sequence_logps_from_hidden(hidden.last_hidden_state, policy.lm_head, batch["labels"], batch["segments"])
    assert torch.equal(na, nb) and torch.allclose(a, b, rtol=1e-5)


def test_block_causal_mask_keeps_each_sample_to_itself() -> None:
    seg = torch.tensor([[0, 0, 1, 1, 1, -1]])
    allowed = block_causal_mask(seg)[0, 0] == 0
    want = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0],
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, want)


def test_collator_refuses_a_pair_apart(pref_rows: list[dict[str, Any]]) -> None:
    row = dict(pref_rows[0])
    n = row["seq_lengths"][0]
    cut = {
        "input_ids": row["input_ids"][:n],
        "labels": row["labels"][:n],
        "position_ids": row["position_ids"][:n],
        "seq_lengths": [n],
        "sample_index": row["sample_index"][:1],
        "sample_role": row["sample_role"][:1],
    }
    with pytest.raises(ValueError, match="chosen sample without its rejected sample"):
        PreferenceCollator()([cut])
    with pytest.raises(KeyError, match="sample_role"):
        PreferenceCollator()([{k: v for k, v in row.items() if k != "sample_role"}])


def test_train_dpo_example_runs(tmp_path: Path) -> None:
    """examples/train_dpo.py trains a tiny Llama on a preference output: the first loss is ln 2 (the policy
    starts as the reference), and it goes down over the epochs."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("train_dpo", root / "examples" / "train_dpo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "pref"
    _pack(preference_records(8, seed=23), out)
    losses = module.train(out, steps=6, batch_rows=1, lr=3e-3, tiny=True, log=lambda *a: None)
    assert len(losses) == 6
    assert abs(losses[0] - math.log(2)) < 1e-5
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2
    assert json.loads((out / "manifest.json").read_text())["task"] == "preference"


def test_dpo_imports_only_the_collator_and_the_contract() -> None:
    import ast

    source = (Path(__file__).resolve().parents[1] / "packcli" / "train" / "dpo.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom) and node.module}
    assert {m for m in imported if m.startswith("packcli")} == {"packcli.train.collate", "packcli.contract"}
