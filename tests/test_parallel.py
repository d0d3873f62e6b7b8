"""Context-parallel rows (samples padded to a multiple) and per-sample loss weights, on a tiny Llama.

The properties: in rows packed with --pad-to-multiple-of / --context-parallel, each sample's loss equals
its loss alone (sdpa and eager, one forward pass over the row and over PackedCollator's batches), its
padding carries no loss and changing the pad tokens changes nothing; with --loss-weighting sample every
sample weighs 1 in total and ``weighted_loss`` is the mean of the samples' mean losses run unpacked,
also split over micro-batches with ``num_items_in_batch``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM
from transformers.masking_utils import find_packed_sequence_indices

from packcli.train.collate import IGNORE_INDEX, PackedCollator, weighted_loss

from .test_trainer import REL_TOL, Stats, _forward_stats, _pack, _read_rows, _records, _rel, _tiny_model

CP = 4  # --context-parallel 4: every sample padded to a multiple of 2 x 4 = 8
MULTIPLE = 2 * CP
SMALL_VOCAB = 997  # the weighting tests fold token ids into a small vocabulary, so full logits stay small


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("parallel")
    with open(data / "chat.jsonl", "w", encoding="utf-8") as fh:
        for record in _records(10, seed=5):
            fh.write(json.dumps(record) + "\n")
    return data


@pytest.fixture(scope="module")
def cp_rows(data_dir: Path) -> list[dict[str, Any]]:
    rows = _read_rows(_pack(data_dir, data_dir / "cp", "--context-parallel", str(CP), "--loss-weighting", "sample"))
    assert max(len(r["seq_lengths"]) for r in rows) >= 3, "the data should put several samples in a row"
    return rows


@pytest.fixture(scope="module")
def plain_rows(data_dir: Path) -> list[dict[str, Any]]:
    return _read_rows(_pack(data_dir, data_dir / "plain"))


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request: pytest.FixtureRequest, cp_rows: list[dict[str, Any]]) -> LlamaForCausalLM:
    vocab = max(max(r["input_ids"]) for r in cp_rows) + 1
    return _tiny_model(vocab, request.param, initializer_range=1.0).eval()


def _samples(row: dict[str, Any]) -> list[tuple[int, list[int], list[int], int]]:
    """(sample_index, real ids, real labels, padded length) of each sample of a row."""
    out, start = [], 0
    for n, real, index in zip(row["seq_lengths"], row["seq_lengths_unpadded"], row["sample_index"], strict=True):
        out.append((index, row["input_ids"][start : start + real], row["labels"][start : start + real], n))
        start += n
    return out


@pytest.fixture(scope="module")
def alone(model: LlamaForCausalLM, cp_rows: list[dict[str, Any]]) -> dict[int, Stats]:
    """Each sample's loss run alone and unpadded: its real tokens, positions 0..n-1."""
    result: dict[int, Stats] = {}
    with torch.no_grad():
        for row in cp_rows:
            for index, ids, labels, _ in _samples(row):
                n = len(ids)
                (result[index],) = _forward_stats(
                    model,
                    torch.tensor(labels)[None],
                    [[n]],
                    input_ids=torch.tensor(ids)[None],
                    position_ids=torch.arange(n)[None],
                )
    return result


def _check(stats: list[Stats], indices: list[int], alone: dict[int, Stats]) -> float:
    worst = 0.0
    for (total, count), index in zip(stats, indices, strict=True):
        alone_total, alone_count = alone[index]
        assert count == alone_count > 0  # the padding adds no trained token
        worst = max(worst, _rel(total / count, alone_total / alone_count))
    assert worst <= REL_TOL, f"a sample's loss in its padded row differs from its loss alone by {worst:.2e}"
    return worst


def test_rows_are_padded_per_sample(cp_rows: list[dict[str, Any]], plain_rows: list[dict[str, Any]]) -> None:
    plain = {i: (r, k) for r in plain_rows for k, i in enumerate(r["sample_index"])}
    padded_somewhere = False
    for row in cp_rows:
        assert len(row["input_ids"]) <= 256 and len(row["input_ids"]) % MULTIPLE == 0
        assert sum(row["seq_lengths"]) == len(row["input_ids"])
        for index, ids, labels, n in _samples(row):
            assert n % MULTIPLE == 0 and n - MULTIPLE < len(ids) <= n
            padded_somewhere |= n > len(ids)
            other, k = plain[index]  # the same sample, packed without padding: the same tokens and labels
            start = sum(other["seq_lengths"][:k])
            assert ids == other["input_ids"][start : start + len(ids)]
            assert labels == other["labels"][start : start + len(ids)]
        start = 0
        for n, real in zip(row["seq_lengths"], row["seq_lengths_unpadded"], strict=True):
            assert row["labels"][start + real : start + n] == [IGNORE_INDEX] * (n - real)  # padding takes no loss
            assert row["loss_weights"][start + real : start + n] == [0.0] * (n - real)
            assert row["position_ids"][start : start + n] == list(range(n))  # positions go on through the padding
            start += n
    assert padded_somewhere


def test_transformers_sees_each_padded_sample_as_its_own_sequence(cp_rows: list[dict[str, Any]]) -> None:
    for row in cp_rows:
        segments = find_packed_sequence_indices(torch.tensor(row["position_ids"])[None])
        expected = np.repeat(np.arange(len(row["seq_lengths"])), row["seq_lengths"])
        if segments is None:  # one sample in the row: nothing to tell apart
            assert len(row["seq_lengths"]) == 1
            continue
        assert segments[0].tolist() == expected.tolist()


def test_padded_rows_match_alone(
    model: LlamaForCausalLM, cp_rows: list[dict[str, Any]], alone: dict[int, Stats]
) -> None:
    worst = 0.0
    with torch.no_grad():
        for row in cp_rows:
            ids, labels, positions = (torch.tensor(row[k])[None] for k in ("input_ids", "labels", "position_ids"))
            stats = _forward_stats(model, labels, [row["seq_lengths"]], input_ids=ids, position_ids=positions)
            worst = max(worst, _check(stats, row["sample_index"], alone))
    assert len(alone) == sum(len(r["sample_index"]) for r in cp_rows)
    print(f"\n{model.config._attn_implementation}: CP-padded row vs alone, max relative difference {worst:.2e}")


@pytest.mark.parametrize("mode", ["flatten", "padded"])
def test_collated_padded_rows_match_alone(
    mode: str, model: LlamaForCausalLM, cp_rows: list[dict[str, Any]], alone: dict[int, Stats]
) -> None:
    batch = PackedCollator(mode, pad_token_id=3, pad_to_multiple_of=MULTIPLE)(cp_rows)
    if mode == "flatten":
        lengths = [torch.diff(batch["cu_seq_lens_q"]).tolist()]
        real = torch.diff(batch["cu_seq_lens_unpadded"]).tolist()
        assert real == [
            n for r in cp_rows for n in r["seq_lengths_unpadded"]
        ]  # every row is a multiple of 8: no batch padding
        assert lengths[0] == [n for r in cp_rows for n in r["seq_lengths"]]
    else:
        lengths = [r["seq_lengths"] for r in cp_rows]
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "loss_weights")}
    with torch.no_grad():  # the cu_seq_lens kwargs are passed too: sdpa and eager ignore them
        stats = _forward_stats(model, batch["labels"], lengths, **inputs)
    _check(stats, [i for r in cp_rows for i in r["sample_index"]], alone)


def test_pad_tokens_change_nothing(model: LlamaForCausalLM, cp_rows: list[dict[str, Any]]) -> None:
    row = max(
        cp_rows, key=lambda r: sum(n - u for n, u in zip(r["seq_lengths"], r["seq_lengths_unpadded"], strict=True))
    )
    ids, positions = (torch.tensor(row[k])[None] for k in ("input_ids", "position_ids"))
    in_padding = torch.zeros(ids.shape[1], dtype=torch.bool)
    start = 0
    for n, real in zip(row["seq_lengths"], row["seq_lengths_unpadded"], strict=True):
        in_padding[start + real : start + n] = True
        start += n
    assert int(in_padding.sum()) >= 2
    other = ids.clone()
    other[0, in_padding] = torch.randint(
        0, model.config.vocab_size, (int(in_padding.sum()),), generator=torch.Generator().manual_seed(0)
    )
    assert not torch.equal(other, ids)
    with torch.no_grad():
        before = model(input_ids=ids, position_ids=positions).logits[0, ~in_padding]
        after = model(input_ids=other, position_ids=positions).logits[0, ~in_padding]
    assert float((before - after).abs().max() / before.abs().max()) <= REL_TOL


# -- loss weighting --------------------------------------------------------------------------------


def _folded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with token ids folded into SMALL_VOCAB (labels alike): the same samples, small logits."""
    out = []
    for row in rows:
        ids = [t % SMALL_VOCAB for t in row["input_ids"]]
        labels = [t % SMALL_VOCAB if t != IGNORE_INDEX else IGNORE_INDEX for t in row["labels"]]
        out.append({**row, "input_ids": ids, "labels": labels})
    return out


@pytest.fixture(scope="module")
def small_model() -> LlamaForCausalLM:
    return _tiny_model(SMALL_VOCAB, "sdpa", initializer_range=1.0).eval()


def _sample_means(model: LlamaForCausalLM, rows: list[dict[str, Any]]) -> dict[int, float]:
    """Each sample's mean token loss, run alone and unpadded."""
    means = {}
    with torch.no_grad():
        for row in rows:
            for index, ids, labels, _ in _samples(row):
                n = len(ids)
                ((total, count),) = _forward_stats(
                    model,
                    torch.tensor(labels)[None],
                    [[n]],
                    input_ids=torch.tensor(ids)[None],
                    position_ids=torch.arange(n)[None],
                )
                means[index] = total / count
    return means


def test_sample_weighting_gives_every_sample_the_same_weight(cp_rows: list[dict[str, Any]]) -> None:
    totals, sizes = [], []
    for row in cp_rows:
        weights = np.asarray(row["loss_weights"], dtype=np.float32)
        labels = np.asarray(row["labels"])
        assert weights.dtype == np.float32 and len(weights) == len(labels)
        assert (weights[labels == IGNORE_INDEX] == 0).all()
        start = 0
        for n in row["seq_lengths"]:
            w, trained = weights[start : start + n], labels[start : start + n] != IGNORE_INDEX
            assert trained.sum() > 0 and np.allclose(w[trained], 1.0 / trained.sum())  # 1/n on each trained token
            totals.append(float(w.sum(dtype=np.float64)))
            sizes.append(int(trained.sum()))
            start += n
    assert len(totals) >= 10
    assert max(abs(t - 1.0) for t in totals) <= 1e-6  # every sample weighs 1 in total
    # and the samples do differ in size: under token weighting they would not weigh the same
    assert max(sizes) > 2 * min(sizes)


def test_weighted_loss_is_the_mean_of_sample_means(
    small_model: LlamaForCausalLM, cp_rows: list[dict[str, Any]]
) -> None:
    rows = _folded(cp_rows)
    means = _sample_means(small_model, rows)
    expected = sum(means.values()) / len(means)
    token_mean = None
    batch = PackedCollator("flatten")(rows)
    assert batch["loss_weights"].dtype == torch.float32 and batch["loss_weights"].shape == batch["labels"].shape
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "loss_weights")}
    with torch.no_grad():
        logits = small_model(**inputs).logits
        got = float(weighted_loss(logits, batch["labels"], batch["loss_weights"]))
        token_mean = float(small_model.loss_function(logits, batch["labels"], SMALL_VOCAB))
    assert _rel(got, expected) <= REL_TOL
    assert _rel(token_mean, expected) > 1e-3  # the token mean is another number: the test can tell them apart
    # Gradient accumulation: micro-batches each divided by the step's weight total add up to the same loss.
    halves = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    batches = [PackedCollator("padded")(h) for h in halves]
    step_total = sum(float(b["loss_weights"].sum()) for b in batches)
    assert step_total == pytest.approx(len(means), rel=1e-6)  # the number of samples in the step
    accumulated = 0.0
    with torch.no_grad():
        for b in batches:
            logits = small_model(input_ids=b["input_ids"], position_ids=b["position_ids"]).logits
            accumulated += float(weighted_loss(logits, b["labels"], b["loss_weights"], num_items_in_batch=step_total))
    assert _rel(accumulated, expected) <= REL_TOL


def test_sqrt_weighting(data_dir: Path) -> None:
    rows = _read_rows(_pack(data_dir, data_dir / "sqrt", "--loss-weighting", "sqrt"))
    assert "seq_lengths_unpadded" not in rows[0]  # no padding asked for: no padded boundaries either
    for row in rows:
        weights, labels = np.asarray(row["loss_weights"]), np.asarray(row["labels"])
        start = 0
        for n in row["seq_lengths"]:
            trained = int((labels[start : start + n] != IGNORE_INDEX).sum())
            assert math.isclose(
                float(weights[start : start + n].sum(dtype=np.float64)), math.sqrt(trained), rel_tol=1e-6
            )
            start += n
