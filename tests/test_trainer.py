"""Training on packcli shards with torch and transformers.

The property that matters: a sample in a packed row gets exactly the loss it gets alone, in one forward
pass over the row (per-sample position_ids, no attention mask, no cache) and in the batches that
PackedCollator makes. Negative controls show that the comparison does fail when samples see each other.
Then the Hugging Face Trainer and a plain PyTorch loop (the scripts in examples/) train a tiny model.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import find_packed_sequence_indices
from typer.testing import CliRunner

from packcli.cli import app
from packcli.tokenize.encoders.tokenizer import default_tokenizer_dir
from packcli.train.collate import IGNORE_INDEX, PackedCollator

ROOT = Path(__file__).resolve().parents[1]
MAX_LEN = 256
REL_TOL = 1e-5  # packed vs alone, relative
LEAK = 1e-3  # a sample that attends to another sample's tokens moves its loss by more than this (relative)
IMPLS = ["sdpa", "eager"]
WORDS = [
    *("rows", "samples", "tokens", "packing", "padding", "labels", "positions", "attention", "model", "loss"),
    *("batch", "shard", "cache", "mask", "sequence", "learns", "never", "mixes", "each", "alone", "boundary"),
]

Stats = tuple[float, int]  # (sum of the token losses, number of trained tokens)


# -- data: real shards written by the CLI ----------------------------------------------------------


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."

    records = []
    for i in range(n):
        messages = []
        for _ in range(2 if i % 4 == 0 else 1):
            messages.append({"role": "user", "content": text(3, 10)})
            messages.append({"role": "assistant", "content": text(4, 30)})
        records.append({"messages": messages})
    return records


def _pack(data: Path, out: Path, *extra: str) -> Path:
    args = ["pack", str(data / "chat.jsonl"), "--max-len", str(MAX_LEN), "-o", str(out)]
    args += ["--cache-dir", str(data / "cache"), "--num-proc", "1", "--quiet", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def _read_rows(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(out.glob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("train")
    with open(data / "chat.jsonl", "w", encoding="utf-8") as fh:
        for record in _records(10, seed=3):
            fh.write(json.dumps(record) + "\n")
    return data


@pytest.fixture(scope="module")
def shard_dir(data_dir: Path) -> Path:
    return _pack(data_dir, data_dir / "out")


@pytest.fixture(scope="module")
def rows(shard_dir: Path) -> list[dict[str, Any]]:
    rows = _read_rows(shard_dir)
    assert len(rows) >= 2
    assert max(len(r["seq_lengths"]) for r in rows) >= 3, "the data should put several samples in a row"
    assert all(len(r["input_ids"]) <= MAX_LEN for r in rows)
    return rows


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(default_tokenizer_dir())


# -- model and per-sample losses -------------------------------------------------------------------


def _tiny_model(
    vocab_size: int, impl: str, initializer_range: float, seed: int = 0, max_positions: int = 2 * MAX_LEN
) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation=impl,
    )
    model = LlamaForCausalLM(config).float()
    assert model.config._attn_implementation == impl
    return model


@pytest.fixture(scope="module", params=IMPLS)
def model(request: pytest.FixtureRequest, tokenizer: Any) -> LlamaForCausalLM:
    # A wide initialisation keeps the logits far from uniform and the attention sharp. At the default 0.02
    # every loss is close to ln(vocab) whatever the context: a sample seeing its neighbours would move its
    # loss by about 1e-4 and the negative controls could not tell a leak from a match.
    return _tiny_model(len(tokenizer), request.param, initializer_range=1.0).eval()


def _forward_stats(
    model: LlamaForCausalLM, labels: torch.Tensor, lengths: list[list[int]], **inputs: Any
) -> list[Stats]:
    """One forward pass over the batch; the per-segment losses of each batch row (``lengths[k]`` for row k).

    Logits are computed only where a label is trained: with a 129k vocabulary, full logits dominate the
    cost of these tests. The model's own loss is checked separately, from full logits.
    """
    hidden = model.model(**inputs).last_hidden_state
    stats: list[Stats] = []
    for k, row_lengths in enumerate(lengths):
        target = torch.full_like(labels[k], IGNORE_INDEX)
        start = 0
        for n in row_lengths:  # shift inside each segment: its last position predicts nothing
            target[start : start + n - 1] = labels[k, start + 1 : start + n]
            start += n
        trained = torch.nonzero(target != IGNORE_INDEX).reshape(-1)
        token_loss = torch.zeros(len(target))
        token_loss[trained] = F.cross_entropy(model.lm_head(hidden[k, trained]), target[trained], reduction="none")
        start = 0
        for n in row_lengths:
            count = int((target[start : start + n] != IGNORE_INDEX).sum())
            stats.append((float(token_loss[start : start + n].sum()), count))
            start += n
    return stats


@pytest.fixture(scope="module")
def alone(model: LlamaForCausalLM, rows: list[dict[str, Any]]) -> dict[int, Stats]:
    """Each sample's loss when it runs alone: its own tokens, positions 0..n-1; by sample_index."""
    result: dict[int, Stats] = {}
    with torch.no_grad():
        for row in rows:
            start = 0
            for n, index in zip(row["seq_lengths"], row["sample_index"], strict=True):
                ids = torch.tensor(row["input_ids"][start : start + n])[None]
                labels = torch.tensor(row["labels"][start : start + n])[None]
                positions = torch.arange(n)[None]
                (result[index],) = _forward_stats(model, labels, [[n]], input_ids=ids, position_ids=positions)
                start += n
    return result


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def _diffs(stats: list[Stats], indices: list[int], alone: dict[int, Stats]) -> list[float]:
    """Relative difference of each real sample's loss from its alone loss (padding segments skipped)."""
    diffs = []
    for (total, count), index in zip(stats, indices, strict=True):
        if index < 0:  # a padding segment: nothing trained
            assert count == 0
            continue
        alone_total, alone_count = alone[index]
        assert count == alone_count > 0
        diffs.append(_rel(total / count, alone_total / alone_count))
    return diffs


def _assert_matches_alone(stats: list[Stats], indices: list[int], alone: dict[int, Stats]) -> float:
    """Assert each real sample's packed loss equals its alone loss; return the largest relative difference."""
    diffs = _diffs(stats, indices, alone)
    assert len(diffs) == len(alone), "every sample should be checked"
    assert max(diffs) <= REL_TOL, f"a sample's packed loss differs from its alone loss by {max(diffs):.2e}"
    return max(diffs)


def _mean_loss(indices: list[int], alone: dict[int, Stats]) -> float:
    """The token-weighted mean loss of these samples run alone: what the model's own loss must be."""
    real = [alone[i] for i in indices if i >= 0]
    return sum(t for t, _ in real) / sum(c for _, c in real)


def _tensors(row: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids, labels, positions = (torch.tensor(row[k])[None] for k in ("input_ids", "labels", "position_ids"))
    return ids, labels, positions


def _report(model: LlamaForCausalLM, what: str, worst: float) -> None:
    print(f"\n{model.config._attn_implementation}: {what} vs alone, max relative loss difference {worst:.2e}")


# -- packed equals alone ---------------------------------------------------------------------------


def test_packed_rows_match_alone(model: LlamaForCausalLM, rows: list[dict[str, Any]], alone: dict[int, Stats]) -> None:
    worst = 0.0
    with torch.no_grad():
        for row in rows:
            ids, labels, positions = _tensors(row)
            stats = _forward_stats(model, labels, [row["seq_lengths"]], input_ids=ids, position_ids=positions)
            diffs = _diffs(stats, row["sample_index"], alone)
            assert max(diffs) <= REL_TOL, f"a sample's packed loss differs from its alone loss by {max(diffs):.2e}"
            worst = max(worst, *diffs)
    _report(model, "one packed row", worst)


def test_model_loss_on_a_packed_row_is_the_mean_of_the_samples(
    model: LlamaForCausalLM, rows: list[dict[str, Any]], alone: dict[int, Stats]
) -> None:
    # The model shifts the unshifted labels over the whole row: only the -100 on each sample's first label
    # stops a sample's last logit from being trained on the next sample's first token.
    row = max(rows, key=lambda r: len(r["seq_lengths"]))
    ids, labels, positions = _tensors(row)
    starts = np.cumsum([0, *row["seq_lengths"][:-1]])
    assert all(labels[0, s] == IGNORE_INDEX for s in starts)
    leaky = labels.clone()
    leaky[0, starts[1:]] = ids[0, starts[1:]]  # as if the first token of each later sample were trained
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=positions, labels=labels)
    expected = _mean_loss(row["sample_index"], alone)
    assert float(out.loss) == pytest.approx(expected, rel=REL_TOL)
    vocab = model.config.vocab_size
    assert float(model.loss_function(out.logits, labels, vocab)) == pytest.approx(expected, rel=REL_TOL)
    assert _rel(float(model.loss_function(out.logits, leaky, vocab)), expected) > LEAK


def test_padded_batch_matches_alone(
    model: LlamaForCausalLM, rows: list[dict[str, Any]], alone: dict[int, Stats], tokenizer: Any
) -> None:
    batch = PackedCollator("padded", pad_token_id=tokenizer.pad_token_id)(rows)
    assert batch["input_ids"].shape == (len(rows), max(len(r["input_ids"]) for r in rows))
    with torch.no_grad():
        stats = _forward_stats(model, batch["labels"], [r["seq_lengths"] for r in rows], **_inputs(batch))
    worst = _assert_matches_alone(stats, [i for r in rows for i in r["sample_index"]], alone)
    _report(model, "padded batch", worst)


def test_flatten_batch_matches_alone(
    model: LlamaForCausalLM, rows: list[dict[str, Any]], alone: dict[int, Stats]
) -> None:
    batch = PackedCollator("flatten")(rows)
    lengths = torch.diff(batch["cu_seq_lens_q"]).tolist()
    with torch.no_grad():  # the flash-attention kwargs are passed too: sdpa and eager ignore them
        stats = _forward_stats(model, batch["labels"], [lengths], **_inputs(batch))
    worst = _assert_matches_alone(stats, [i for r in rows for i in r["sample_index"]], alone)
    _report(model, "flatten batch", worst)


def _inputs(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if k != "labels"}


@pytest.mark.parametrize("mode", ["flatten", "padded"])
def test_pad_to_max_shards_match_alone(
    mode: str, model: LlamaForCausalLM, data_dir: Path, alone: dict[int, Stats], tokenizer: Any
) -> None:
    out_dir = data_dir / "out-pad"
    if not out_dir.exists():
        _pack(data_dir, out_dir, "--pad-to-max")
    rows = _read_rows(out_dir)
    assert all(len(r["input_ids"]) == MAX_LEN for r in rows)
    assert any(r["sample_index"][-1] == -1 for r in rows), "some row should end with a padding segment"
    batch = PackedCollator(mode, pad_token_id=tokenizer.pad_token_id)(rows)
    flat = mode == "flatten"
    lengths = [torch.diff(batch["cu_seq_lens_q"]).tolist()] if flat else [r["seq_lengths"] for r in rows]
    with torch.no_grad():
        stats = _forward_stats(model, batch["labels"], lengths, **_inputs(batch))
    _assert_matches_alone(stats, [i for r in rows for i in r["sample_index"]], alone)


# -- negative controls: the comparison fails when samples see each other -----------------------------


@pytest.mark.parametrize("variant", ["no_position_ids", "all_ones_attention_mask", "use_cache"])
def test_leaks_are_detected(
    variant: str, model: LlamaForCausalLM, rows: list[dict[str, Any]], alone: dict[int, Stats]
) -> None:
    """Without per-sample positions (the model then counts 0..T-1), with an all-ones attention mask, or with a
    cache, transformers builds a plain causal mask over the row and every later sample sees the ones before it."""
    later: list[float] = []
    with torch.no_grad():
        for row in rows:
            ids, labels, positions = _tensors(row)
            inputs: dict[str, Any] = {"input_ids": ids}
            if variant == "all_ones_attention_mask":
                inputs.update(position_ids=positions, attention_mask=torch.ones_like(ids))
            elif variant == "use_cache":
                inputs.update(position_ids=positions, use_cache=True)
            diffs = _diffs(_forward_stats(model, labels, [row["seq_lengths"]], **inputs), row["sample_index"], alone)
            assert diffs[0] <= REL_TOL  # the first sample of a row has nothing before it to see
            later += diffs[1:]
    # Every later sample fails the packed-equals-alone check by a wide margin, and most move by more than LEAK.
    assert len(later) >= 3
    assert min(later) > 10 * REL_TOL, f"{variant}: a later sample's loss moved by only {min(later):.2e}"
    assert float(np.median(later)) > LEAK, f"{variant}: the later samples' losses moved by {np.median(later):.2e}"


# -- PackedCollator layout -------------------------------------------------------------------------


def test_flatten_layout(rows: list[dict[str, Any]]) -> None:
    batch = PackedCollator("flatten", pad_token_id=7)(rows)
    varlen = {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
    assert set(batch) == {"input_ids", "labels", "position_ids", *varlen}  # never an attention_mask
    total = sum(len(r["input_ids"]) for r in rows)
    for key in ("input_ids", "labels", "position_ids"):
        assert batch[key].shape == (1, total)
        assert batch[key].dtype == torch.int64
        assert batch[key][0].tolist() == [x for r in rows for x in r[key]]
    lengths = [n for r in rows for n in r["seq_lengths"]]
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert batch[key].dtype == torch.int32
        assert batch[key].tolist() == [0, *np.cumsum(lengths).tolist()]
    assert batch["max_length_q"] == batch["max_length_k"] == max(lengths)
    assert type(batch["max_length_q"]) is int and type(batch["max_length_k"]) is int
    # position_ids restart at 0 exactly at the sample boundaries
    starts = torch.nonzero(batch["position_ids"][0] == 0).reshape(-1).tolist()
    assert starts == batch["cu_seq_lens_q"][:-1].tolist()
    assert all(batch["labels"][0, s] == IGNORE_INDEX for s in starts)


def test_padded_layout(rows: list[dict[str, Any]]) -> None:
    batch = PackedCollator("padded", pad_token_id=7)(rows)
    assert set(batch) == {"input_ids", "labels", "position_ids"}  # never an attention_mask
    width = max(len(r["input_ids"]) for r in rows)
    assert min(len(r["input_ids"]) for r in rows) < width, "the test needs rows of different lengths"
    segments = find_packed_sequence_indices(batch["position_ids"])
    assert segments is not None
    for k, row in enumerate(rows):
        n = len(row["input_ids"])
        for key in ("input_ids", "labels", "position_ids"):
            assert batch[key].shape == (len(rows), width)
            assert batch[key].dtype == torch.int64
            assert batch[key][k, :n].tolist() == row[key]
        pad = width - n
        assert batch["input_ids"][k, n:].tolist() == [7] * pad
        assert batch["labels"][k, n:].tolist() == [IGNORE_INDEX] * pad
        assert batch["position_ids"][k, n:].tolist() == list(range(pad))
        # transformers sees the padding as one sequence of its own, after the row's samples
        seg = segments[k].tolist()
        assert len(set(seg[:n])) == len(row["seq_lengths"])
        if pad:
            assert len(set(seg[n:])) == 1 and seg[n] != seg[n - 1]


def test_pad_to_multiple_of(rows: list[dict[str, Any]]) -> None:
    flat = PackedCollator("flatten", pad_token_id=7, pad_to_multiple_of=64)(rows)
    total = sum(len(r["input_ids"]) for r in rows)
    width = -(-total // 64) * 64
    assert flat["input_ids"].shape == (1, width)
    cu = flat["cu_seq_lens_q"].tolist()
    if width > total:
        assert cu[-2:] == [total, width]  # the padding is its own segment, untrained, positions from 0
        assert flat["labels"][0, total:].eq(IGNORE_INDEX).all()
        assert flat["position_ids"][0, total:].tolist() == list(range(width - total))
    padded = PackedCollator("padded", pad_to_multiple_of=100)(rows)
    assert padded["input_ids"].shape[1] % 100 == 0


def test_row_value_types_and_missing_seq_lengths(rows: list[dict[str, Any]]) -> None:
    expected = PackedCollator("flatten")(rows)
    as_numpy = [{k: np.asarray(v) for k, v in r.items() if k != "seq_lengths"} for r in rows]
    as_torch = [{k: torch.tensor(v) for k, v in r.items()} for r in rows]
    for variant in (as_numpy, as_torch):
        got = PackedCollator("flatten")(variant)
        assert set(got) == set(expected)
        for key, value in expected.items():
            assert torch.equal(torch.as_tensor(got[key]), torch.as_tensor(value)), key


def test_collator_rejects_bad_input(rows: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="mode"):
        PackedCollator("packed")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        PackedCollator("flatten", pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="empty batch"):
        PackedCollator("flatten")([])
    short = {**rows[0], "labels": rows[0]["labels"][:-1]}
    with pytest.raises(ValueError, match="same length"):
        PackedCollator("padded")([short])
    wrong = {**rows[0], "seq_lengths": [*rows[0]["seq_lengths"][:-1], rows[0]["seq_lengths"][-1] + 1]}
    with pytest.raises(ValueError, match="seq_lengths"):
        PackedCollator("flatten")([wrong])
    missing = {k: v for k, v in rows[0].items() if k != "position_ids"}
    with pytest.raises(KeyError, match="remove_unused_columns"):
        PackedCollator("flatten")([missing])


# -- training: the example scripts on the tiny model -----------------------------------------------


def _example(name: str) -> ModuleType:
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"packcli_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _assert_all_changed(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p.detach(), before[name])]
    assert not unchanged, f"parameters not updated: {unchanged}"


def test_hf_trainer_example(shard_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    example = _example("train_hf_trainer")
    model = _tiny_model(len(tokenizer), "sdpa", initializer_range=0.02)
    before = _snapshot(model)
    trainer = example.build_trainer(
        model,
        example.load_rows(shard_dir, cache_dir=str(tmp_path / "datasets")),
        tmp_path / "run",
        mode="flatten",
        pad_token_id=tokenizer.pad_token_id,
        per_device_train_batch_size=2,
        max_steps=2,
        learning_rate=1e-3,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_pin_memory=False,
        disable_tqdm=True,
        seed=0,
    )
    result = trainer.train()
    assert result.global_step == 2
    assert math.isfinite(result.training_loss)
    assert model.config.use_cache is False  # the Trainer switches the cache off
    _assert_all_changed(model, before)


def test_torch_loop_example(shard_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    example = _example("train_torch_loop")
    model = _tiny_model(len(tokenizer), "sdpa", initializer_range=0.02)
    model.config.use_cache = True  # the loop must switch it off itself
    before = _snapshot(model)
    losses = example.train(
        model,
        example.load_rows(shard_dir, cache_dir=str(tmp_path / "datasets")),
        steps=2,
        mode="padded",
        batch_size=2,
        lr=1e-3,
        pad_token_id=tokenizer.pad_token_id,
    )
    assert len(losses) == 2
    assert all(math.isfinite(x) for x in losses)
    assert model.config.use_cache is False
    _assert_all_changed(model, before)
