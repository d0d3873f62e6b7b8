"""Prefix-tree rows in training: the padded collator's 4-D mask gives every trained token the loss it has
in its expanded sample alone (sdpa and eager), and every layout that cannot express a tree refuses it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from packcli.contract import (
    IGNORE_INDEX,
    PREFIX_TREES,
    SHARD_SCHEMA,
    TREE_COLUMNS,
    file_sha256,
    shard_schema,
    tree_attention,
)
from packcli.errors import IncompatibleError
from packcli.tokenize.trees import build_tree
from packcli.train.checks import check_compatible, load_rows
from packcli.train.collate import PackedCollator
from tests.test_trainer import _tiny_model

VOCAB = 64
Sample = tuple[np.ndarray, np.ndarray]


def _trace(rng: np.random.Generator, rounds: int, prefix: int = 12) -> list[Sample]:
    """One agent trace expanded per round: round j's sample is the tools prefix, the earlier rounds as
    history (their reasoning dropped, as templates render past rounds) and round j in full, trained."""
    tools = rng.integers(1, VOCAB, prefix).tolist()
    history: list[int] = []
    samples = []
    for _ in range(rounds):
        question = rng.integers(1, VOCAB, int(rng.integers(1, 5))).tolist()
        reasoning = rng.integers(1, VOCAB, int(rng.integers(0, 4))).tolist()
        answer = rng.integers(1, VOCAB, int(rng.integers(1, 6))).tolist()
        ids = [*tools, *history, *question, *reasoning, *answer]
        mask = [False] * (len(tools) + len(history) + len(question)) + [True] * (len(reasoning) + len(answer))
        samples.append((np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool)))
        history += [*question, *answer]
    return samples


def _tree_row(traces: list[list[Sample]]) -> dict[str, list[int]]:
    """One packed row of the traces' tree samples, with the tree columns (parents as row node indices)."""
    row: dict[str, list[int]] = {k: [] for k in ("input_ids", "labels", "position_ids", "seq_lengths")}
    row["tree_node_lengths"], row["tree_node_parents"] = [], []
    for samples in traces:
        tree = build_tree(samples)
        offset = len(row["tree_node_lengths"])
        row["input_ids"] += tree.ids.tolist()
        row["labels"] += np.where(tree.trained, tree.ids, IGNORE_INDEX).tolist()
        row["position_ids"] += tree.positions.tolist()
        row["seq_lengths"].append(len(tree))
        row["tree_node_lengths"] += tree.node_lengths.tolist()
        row["tree_node_parents"] += [p + offset if p >= 0 else -1 for p in tree.node_parents.tolist()]
    return row


def _summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """The summed next-token loss over trained labels (unshifted, as the rows hold them) and their count."""
    target = labels[..., 1:].reshape(-1)
    flat = logits[..., :-1, :].reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(flat.float(), target, ignore_index=IGNORE_INDEX, reduction="sum")
    return float(loss), int((target != IGNORE_INDEX).sum())


@pytest.fixture(scope="module")
def traces() -> list[list[Sample]]:
    rng = np.random.default_rng(7)
    return [_trace(rng, rounds) for rounds in (3, 4, 5, 2, 4)]


@pytest.mark.parametrize(("impl", "mask_dtype"), [("sdpa", None), ("eager", None), ("sdpa", torch.bool)])
def test_tree_rows_give_each_trained_token_its_expanded_loss(
    impl: str, mask_dtype: torch.dtype | None, traces: list[list[Sample]]
) -> None:
    model = _tiny_model(VOCAB, impl, initializer_range=1.0, max_positions=512).eval()
    rows = [_tree_row(traces[:2]), _tree_row(traces[2:])]  # rows of different lengths: padding too
    batch = PackedCollator("padded", pad_token_id=0, model=model, mask_dtype=mask_dtype)(rows)
    assert batch["attention_mask"].dtype == (mask_dtype or torch.float32)
    assert batch["attention_mask"].shape == (2, 1, *batch["input_ids"].shape[1:2] * 2)
    with torch.no_grad():
        tree_logits = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
        ).logits
        expected, expected_count = 0.0, 0
        for ids, mask in (s for trace in traces for s in trace):
            labels = torch.as_tensor(np.where(mask, ids, IGNORE_INDEX), dtype=torch.long)[None]
            loss, count = _summed_loss(model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None]).logits, labels)
            expected += loss
            expected_count += count
        tree_loss, tree_count = _summed_loss(tree_logits, batch["labels"])
        assert tree_count == expected_count
        assert tree_loss == pytest.approx(expected, rel=1e-5)
        # Without the mask (position_ids alone), branches see their siblings or lose their prefix.
        plain_logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        plain_loss, _ = _summed_loss(plain_logits, batch["labels"])
        assert abs(plain_loss - expected) > 1e-3 * abs(expected)  # a hundred times the tolerance above
    # The tree rows hold fewer tokens than the expansion, with the same trained tokens.
    assert int(batch["input_ids"].ne(0).sum()) < sum(len(ids) for trace in traces for ids, _ in trace)


def test_plain_rows_collate_as_before_and_tree_rows_are_refused_where_they_cannot_be_kept_apart(
    traces: list[list[Sample]],
) -> None:
    plain = {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 2], "seq_lengths": [3]}
    batch = PackedCollator("padded")([plain])
    assert set(batch) == {"input_ids", "labels", "position_ids"}
    tree = _tree_row(traces[:1])
    with pytest.raises(IncompatibleError, match=r"branches would attend to each other.*PackedCollator\(\"padded\"\)"):
        PackedCollator("flatten")([tree])
    with pytest.raises(ValueError, match="'tree_node_lengths' column and some do not"):
        PackedCollator("padded")([tree, plain])
    broken = {**tree, "tree_node_parents": [0, *tree["tree_node_parents"][1:]]}
    with pytest.raises(ValueError, match="tree_node_lengths must tile every sample"):
        PackedCollator("padded")([broken])
    cut = {**tree, "tree_node_lengths": [tree["tree_node_lengths"][0] + 1, *tree["tree_node_lengths"][1:]]}
    with pytest.raises(ValueError, match="tree_node_lengths must tile every sample"):
        PackedCollator("padded")([cut])
    # A plain sample is one root node: its mask is causal, and the padding a causal segment of its own.
    mask = PackedCollator("padded")([{**plain, "tree_node_lengths": [3], "tree_node_parents": [-1]}, tree])
    allowed = mask["attention_mask"][0, 0] == 0
    width = allowed.shape[-1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    causal[3:, :3] = False
    assert torch.equal(allowed, causal)


def test_a_tree_output_is_refused_by_a_consumer_that_cannot_express_it(tmp_path: Path) -> None:
    out = tmp_path / "packed"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"max_len": 64, "shards": [], PREFIX_TREES: True}))
    refusal = r"holds prefix trees, whose branches would attend to each other.*trees=True"
    with pytest.raises(IncompatibleError, match=refusal):
        check_compatible(out, task="sft")
    with pytest.raises(IncompatibleError, match=refusal):
        load_rows(out)
    with pytest.raises(IncompatibleError, match=refusal):
        PackedCollator("flatten", output=out)
    assert check_compatible(out, task="sft", trees=True).task == "sft"
    assert PackedCollator("padded", output=out).compatibility is not None
    plain: Any = {"max_len": 64, "shards": []}
    (out / "manifest.json").write_text(json.dumps(plain))
    assert check_compatible(out, task="sft").task == "sft"


def _write_tree_output(directory: Path, rows: list[dict[str, list[int]]]) -> None:
    """A packed output of tree rows, as the contract describes it: one Parquet shard and its manifest."""
    names = [*SHARD_SCHEMA.names, *TREE_COLUMNS]
    table_rows = [
        {**row, "sample_index": list(range(len(row["seq_lengths"]))), "piece_index": [0] * len(row["seq_lengths"])}
        for row in rows
    ]
    table = pa.Table.from_pylist([{n: r[n] for n in names} for r in table_rows], schema=shard_schema(TREE_COLUMNS))
    directory.mkdir()
    shard = directory / "shard-00000-of-00001.parquet"
    pq.write_table(table, shard)
    tokens = sum(len(r["input_ids"]) for r in rows)
    entry = {"file": shard.name, "rows": len(rows), "tokens": tokens, "sha256": file_sha256(shard)}
    max_id = max(max(r["input_ids"]) for r in rows)
    manifest = {"task": "sft", "max_len": 512, "max_token_id": max_id, "shards": [entry], "columns": names}
    (directory / "manifest.json").write_text(json.dumps({**manifest, PREFIX_TREES: True}), encoding="utf-8")


def test_the_guide_training_example_runs_on_tree_rows(
    tmp_path: Path, traces: list[list[Sample]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write_tree_output(tmp_path / "OUT", [_tree_row(traces[:2]), _tree_row(traces[2:4]), _tree_row(traces[4:])])
    text = (Path(__file__).parents[1] / "docs" / "guides" / "trees.md").read_text(encoding="utf-8")
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "load_rows(" in b]
    model = _tiny_model(VOCAB, "sdpa", initializer_range=1.0, max_positions=512)
    before = [p.detach().clone() for p in model.parameters()]
    names: dict[str, Any] = {"model": model}
    exec(compile(example, "docs/guides/trees.md", "exec"), names)
    assert "attention_mask" in names["batch"] and torch.isfinite(names["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_mask_takes_the_model_dtype_unless_told(traces: list[list[Sample]]) -> None:
    row = _tree_row(traces[:1])
    model = _tiny_model(VOCAB, "eager", initializer_range=0.02, max_positions=512).to(torch.bfloat16)
    assert PackedCollator("padded", model=model)([row])["attention_mask"].dtype == torch.bfloat16
    assert PackedCollator("padded")([row])["attention_mask"].dtype == torch.float32
    mask = PackedCollator("padded", model=model, mask_dtype=torch.float16)([row])["attention_mask"]
    assert mask.dtype == torch.float16 and float(mask.min()) == torch.finfo(torch.float16).min
    allowed = PackedCollator("padded", mask_dtype=torch.bool)([row, _tree_row(traces[1:3])])["attention_mask"]
    additive = PackedCollator("padded")([row, _tree_row(traces[1:3])])["attention_mask"]
    assert allowed.dtype == torch.bool and torch.equal(allowed, additive == 0)


def test_a_branch_that_starts_with_a_trained_token_would_train_it_from_its_sibling() -> None:
    """Why the builder starts such a branch with a copy of the last shared token: laid out by hand
    without it, the second branch's first token is scored on the first branch's last logit."""
    rng = np.random.default_rng(3)
    prefix, first, second = (rng.integers(1, VOCAB, n).tolist() for n in (8, 4, 4))
    samples = [
        (np.asarray(prefix + first, dtype=np.int32), np.asarray([False] * 8 + [True] * 4)),
        (np.asarray(prefix + second, dtype=np.int32), np.asarray([False] * 8 + [True] * 4)),
    ]
    model = _tiny_model(VOCAB, "sdpa", initializer_range=1.0, max_positions=512).eval()
    naive = {
        "input_ids": prefix + first + second,
        "labels": [IGNORE_INDEX] * 8 + first + second,
        "position_ids": [*range(12), *range(8, 12)],
        "seq_lengths": [16],
        "tree_node_lengths": [8, 4, 4],
        "tree_node_parents": [-1, 0, 0],
    }
    with pytest.raises(ValueError, match="trains the first token of a tree node"):
        PackedCollator("padded")([naive])
    allowed = torch.from_numpy(tree_attention(naive["tree_node_lengths"], naive["tree_node_parents"]))
    naive_batch = {
        "input_ids": torch.as_tensor([naive["input_ids"]]),
        "labels": torch.as_tensor([naive["labels"]]),
        "position_ids": torch.as_tensor([naive["position_ids"]]),
        "attention_mask": torch.zeros(1, 1, 16, 16).masked_fill_(~allowed, torch.finfo(torch.float32).min),
    }
    with torch.no_grad():
        expected = 0.0
        for ids, mask in samples:
            labels = torch.as_tensor(np.where(mask, ids, IGNORE_INDEX), dtype=torch.long)[None]
            expected += _summed_loss(model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None]).logits, labels)[0]
        losses = []
        for batch in (naive_batch, PackedCollator("padded")([_tree_row([samples])])):
            logits = model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
            ).logits
            losses.append(_summed_loss(logits, batch["labels"]))
    (naive_loss, naive_count), (tree_loss, tree_count) = losses
    assert naive_count == tree_count == 8
    assert tree_loss == pytest.approx(expected, rel=1e-5)
    assert abs(naive_loss - expected) > 1e-2 * expected


def test_packed_tree_rows_train_like_the_packed_expansion(tmp_path: Path) -> None:
    """The rows ``pack --prefix-tree`` writes, through load_rows and the padded collator, give the summed
    loss of the same output packed as the plain expansion, sample by sample, over the same trained tokens."""
    from typer.testing import CliRunner

    from packcli.cli import app
    from tests.test_prefix_tree_pack import _trace as agent_trace

    from .conftest import trl_templates, write_jsonl

    data = write_jsonl(tmp_path / "t.jsonl", [{"messages": agent_trace(k, rounds=2 + k % 3)} for k in range(4)])
    argv = ["pack", str(data), "--max-len", "2048", "--chat-template", str(trl_templates() / "qwen3.jinja")]
    argv += ["--expand-turns", "reasoning", "-q", "--num-proc", "1", "--no-cache"]
    for name, extra in (("plain", []), ("trees", ["--prefix-tree"])):
        result = CliRunner().invoke(app, [*argv, "-o", str(tmp_path / name), *extra])
        assert result.exit_code == 0, result.stderr
    plain = load_rows(tmp_path / "plain", task="sft")
    trees = load_rows(tmp_path / "trees", task="sft", trees=True)
    # A small model: the ids the rows use, numbered densely (the same numbering for both outputs).
    vocab = np.unique(np.concatenate([np.asarray(r["input_ids"]) for r in [*plain, *trees]]))

    def dense(values: Any) -> torch.Tensor:
        values = torch.as_tensor(values, dtype=torch.long)
        out = torch.as_tensor(np.searchsorted(vocab, values.clamp(min=0).numpy()), dtype=torch.long)
        return torch.where(values == IGNORE_INDEX, values, out)

    model = _tiny_model(len(vocab), "sdpa", initializer_range=1.0, max_positions=2048).eval()
    with torch.no_grad():
        expected, expected_count = 0.0, 0
        for row in plain:
            start = 0
            for length in row["seq_lengths"]:
                ids = dense(row["input_ids"][start : start + length])[None]
                labels = dense(row["labels"][start : start + length])[None]
                loss, count = _summed_loss(model(input_ids=ids).logits, labels)
                expected, expected_count = expected + loss, expected_count + count
                start += length
        got, got_count = 0.0, 0
        collate = PackedCollator("padded", pad_token_id=0, output=tmp_path / "trees")
        for row in trees:
            batch = collate([{**row, "input_ids": dense(row["input_ids"]).tolist()}])
            logits = model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
            ).logits
            loss, count = _summed_loss(logits, dense(batch["labels"]))
            got, got_count = got + loss, got_count + count
    assert got_count == expected_count > 0
    assert got == pytest.approx(expected, rel=1e-5)
    assert sum(len(r["input_ids"]) for r in trees) < sum(len(r["input_ids"]) for r in plain)
