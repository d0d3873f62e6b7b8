"""The fast encoder (fastokens) against the reference (tokenizers): same ids and masks, and every fallback.

Each fallback reason has a run of its own that must write the shards a ``--encoder tokenizers`` run
writes, byte for byte: a tokenizer fastokens cannot load (a BERT normalizer), a post-processor that
trims offsets, a probe that finds a difference, and records whose pieces do not encode to the whole.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from packcli.errors import TokenizerError
from packcli.records.formats import Sample
from packcli.tokenize.encoders import encoder_choice, text_encoders
from packcli.tokenize.encoders.byte_offsets import token_byte_lengths
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder
from packcli.tokenize.encoders.encoder_choice import ENCODER_ENV, choose
from packcli.tokenize.encoders.text_encoders import FastEncoder, piece_cuts
from packcli.tokenize.encoders.tokenizer import default_tokenizer_dir
from packcli.tokenize.long.bounds import max_token_bytes, tokenizer_settings

from .conftest import make_conversations, write_jsonl

MARK = "ZQXMARK"  # a text holding it is made to encode differently by the fast encoder (see below)


@pytest.fixture(autouse=True)
def _fast_on_small_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """These inputs are small, which ``auto`` encodes with tokenizers: the environment asks for the fast one."""
    monkeypatch.setenv(ENCODER_ENV, "fastokens")


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


def _summary(result: Any) -> dict[str, Any]:
    return dict(json.loads(result.stdout))


def _pack_both(pack: Any, tmp_path: Path, data: Path, *extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pack ``data`` with the run's encoder (auto) and with tokenizers; assert the same shards; return summaries."""
    outs = []
    for mode in ("auto", "tokenizers"):
        out = tmp_path / f"out-{mode}"
        result = pack(data, "-o", out, "--encoder", mode, "--no-cache", "--json", "--quiet", *extra)
        outs.append((_shards(out), _summary(result)))
    (auto_shards, auto), (ref_shards, ref) = outs
    assert auto_shards and auto_shards == ref_shards
    assert ref["encoder"] == {"name": "tokenizers", "fallback": None, "records_slow": 0}
    return auto, ref


def test_the_test_tokenizers_encode_with_fastokens(model_tokenizer: tuple[str, Any]) -> None:
    # The template and tokenizer tests run with the fast encoder: it must be the one they get.
    for name in (None, model_tokenizer[0]):
        encoder = Encoder(name, None, EncodeOptions())
        assert encoder.choice.record().to_dict() == {"fallback": None, "name": "fastokens"}


def test_piece_cuts_part_a_text_at_every_span_end() -> None:
    assert piece_cuts("abcdefgh", [(2, 4), (6, 8)]) == ([0, 2, 4, 6, 8], [False, True, False, True])
    assert piece_cuts("abcd", [(0, 4)]) == ([0, 4], [True])
    assert piece_cuts("abcd", [(3, 2), (5, 9)]) == ([0, 4], [False])  # empty and outside spans are no cut
    assert piece_cuts("abcd", [(1, 3), (2, 4)]) == ([0, 1, 2, 3, 4], [False, True, True, True])
    assert piece_cuts("", [(0, 0)]) == ([0, 0], [])


def _fresh_fast_encoders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load the fast encoders anew in this test, into a cache of its own (the process's is left as it was)."""
    monkeypatch.setattr(encoder_choice, "_loaded", functools.lru_cache(maxsize=4)(encoder_choice._loaded.__wrapped__))


def _masks_by(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make fast encoders loaded from here on make masks by ``method``: bytes (the default) or pieces."""
    _fresh_fast_encoders(monkeypatch)
    if method == "pieces":
        monkeypatch.setattr(text_encoders, "token_byte_lengths", lambda backend_json: None)


@pytest.mark.parametrize("method", ["bytes", "pieces"])
@pytest.mark.parametrize("template", [None, "chatml"])
def test_fast_ids_and_masks_equal_the_reference_on_every_kind(
    method: str, template: str | None, model_tokenizer: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # chatml's markers are not tokens of this tokenizer: BPE merges across the answers' ends.
    _masks_by(method, monkeypatch)
    fast = Encoder(model_tokenizer[0], template, EncodeOptions())
    reference = Encoder(model_tokenizer[0], template, EncodeOptions(), encoder="tokenizers")
    assert (fast.text.name, reference.text.name) == ("fastokens", "tokenizers")
    assert (getattr(fast.text, "byte_lengths", None) is not None) == (method == "bytes")
    samples = [Sample("chat", messages=m) for m in make_conversations(80, seed=3, max_turns=4)]
    samples += [Sample("prompt_completion", prompt="Q: 12+30?\n", completion=" A: 42 😀\n\n")]
    samples += [Sample("text", text="  a text sample, trained whole 中文 \n")]
    got, want = fast.encode_batch(samples), reference.encode_batch(samples)
    for a, b in zip(got, want, strict=True):
        assert isinstance(a, tuple) and isinstance(b, tuple), (a, b)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    if method == "bytes" or template is None:
        assert fast.text.slow_records == 0


def test_a_tokenizer_fastokens_cannot_load_packs_with_tokenizers(tmp_path: Path, pack: Any) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'"
    vocab = {t: i for i, t in enumerate(["[UNK]", "[PAD]", *chars, *(f"##{c}" for c in chars), "the", "##ing"])}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", eos_token="[PAD]")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.save_pretrained(tmp_path / "bert")
    choice = Encoder(str(tmp_path / "bert"), "chatml", EncodeOptions()).choice
    assert choice.encoder.name == "tokenizers"
    assert choice.fallback is not None and choice.fallback.startswith("fastokens cannot load the tokenizer (")
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in make_conversations(20, seed=2)])
    common = ("--tokenizer", tmp_path / "bert", "--chat-template", "chatml")
    auto, _ = _pack_both(pack, tmp_path, data, *common)
    assert auto["encoder"] == {"name": "tokenizers", "fallback": choice.fallback, "records_slow": 0}
    manifest = json.loads((tmp_path / "out-auto" / "manifest.json").read_text())
    assert manifest["encoder"] == auto["encoder"]
    # --encoder fast refuses it, in one line that says why and what to pass.
    result = pack(data, "-o", tmp_path / "out-fast", "--encoder", "fast", "--no-cache", *common, expect=1)
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: the fast encoder cannot be used with this tokenizer: fastokens cannot load")
    assert line.endswith("; pass --encoder auto to encode with tokenizers"), line


def test_a_post_processor_that_trims_offsets_falls_back(tmp_path: Path) -> None:
    spec = json.loads((Path(default_tokenizer_dir()) / "tokenizer.json").read_text(encoding="utf-8"))
    spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(json.dumps(spec))
    choice = choose(backend, backend.to_str)
    assert choice.encoder.name == "tokenizers"
    assert choice.fallback == "the tokenizer's post-processor trims offsets, which label masks follow"


def test_the_reference_opens_while_the_fast_encoder_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a first sight of a tokenizer, the reference and the byte lengths are learned beside the build; a
    trimmed offset stays the reason given when the build fails too, as when it was checked first."""
    import threading

    import fastokens

    spec = json.loads((Path(default_tokenizer_dir()) / "tokenizer.json").read_text(encoding="utf-8"))
    from tokenizers import Tokenizer

    opened_on: list[str] = []
    real = Tokenizer.from_str(json.dumps(spec))

    def opening() -> Any:
        opened_on.append(threading.current_thread().name)
        return real

    built_on: list[str] = []
    build = fastokens.Tokenizer.from_json_str

    def building(text: str) -> Any:
        built_on.append(threading.current_thread().name)
        return build(text)

    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", building)
    encoder_choice._loaded.cache_clear()
    choice = choose(opening, real.to_str)
    assert (choice.encoder.name, choice.fallback) == ("fastokens", None)
    assert built_on == [threading.current_thread().name]  # its tables in the heap the workers share
    assert len(opened_on) == 1 and opened_on[0].startswith("packcli-learn")
    assert isinstance(choice.encoder, FastEncoder) and choice.encoder.byte_lengths is not None

    def refused(text: str) -> Any:
        raise ValueError("not this one")

    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", refused)
    for trims, why in ((True, "the tokenizer's post-processor trims offsets"), (False, "fastokens cannot load")):
        spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trims}
        backend = Tokenizer.from_str(json.dumps(spec))
        encoder_choice._loaded.cache_clear()
        choice = choose(backend, backend.to_str)
        assert choice.encoder.name == "tokenizers"
        assert choice.fallback is not None and choice.fallback.startswith(why), choice.fallback
    encoder_choice._loaded.cache_clear()


def test_the_probes_reference_side_is_made_beside_the_build_and_gives_the_same_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a first sight, the reference encodes the probe's texts on the learning thread while the fast encoder
    builds; the probe then compares with what it made, and finds what a probe that makes it itself finds."""
    import threading

    from tokenizers import Tokenizer

    from packcli.tokenize.encoders import probe

    made_on: list[str] = []
    real = probe.expected_of

    def recording(reference: Any) -> probe.Expected:
        made_on.append(threading.current_thread().name)
        return real(reference)

    monkeypatch.setattr(probe, "expected_of", recording)
    backend = Tokenizer.from_file(str(Path(default_tokenizer_dir()) / "tokenizer.json"))
    encoder_choice._loaded.cache_clear()
    choice = choose(backend, backend.to_str)
    assert (choice.encoder.name, choice.fallback) == ("fastokens", None)
    assert len(made_on) == 1 and made_on[0].startswith("packcli-learn")  # made once, beside the build
    fast = choice.encoder
    assert isinstance(fast, FastEncoder) and fast.expected is None  # let go once the probe used it
    expected = real(fast.reference)
    assert probe.probe_differences(fast, fast.reference, expected) is None
    plain = FastEncoder.encode_flat

    def digits_differ(self: FastEncoder, texts: list[str], add_special: bool) -> tuple[np.ndarray, np.ndarray]:
        ids, starts = plain(self, texts, add_special)
        for k, text in enumerate(texts):
            if "1234567890" in text and starts[k + 1] > starts[k]:
                ids[starts[k]] = 0
        return ids, starts

    monkeypatch.setattr(FastEncoder, "encode_flat", digits_differ)
    either = probe.probe_differences(fast, fast.reference, expected)
    assert either is not None and either == probe.probe_differences(fast, fast.reference)
    assert '"1234567890"' in either
    encoder_choice._loaded.cache_clear()


def test_a_probe_difference_falls_back_and_packs_the_same(
    tmp_path: Path, pack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = FastEncoder.encode_flat

    def emoji_differs(self: FastEncoder, texts: list[str], add_special: bool) -> tuple[np.ndarray, np.ndarray]:
        ids, starts = real(self, texts, add_special)
        for k, text in enumerate(texts):
            if "😀" in text and starts[k + 1] > starts[k]:
                ids[starts[k]] = 0  # a different first id for every text with this emoji
        return ids, starts

    monkeypatch.setattr(FastEncoder, "encode_flat", emoji_differs)
    _fresh_fast_encoders(monkeypatch)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in make_conversations(20, seed=4)])
    auto, _ = _pack_both(pack, tmp_path, data)
    assert auto["encoder"]["name"] == "tokenizers"
    assert auto["encoder"]["fallback"].startswith("fastokens gives other ids than tokenizers for the probe text")
    assert '"emoji \\ud83d\\ude00' in auto["encoder"]["fallback"]  # the first probe text with the emoji
    with pytest.raises(TokenizerError, match="the fast encoder cannot be used"):
        Encoder(None, None, EncodeOptions(), encoder="fast")


@pytest.mark.parametrize("method", ["bytes", "pieces"])
def test_records_the_fast_path_cannot_vouch_for_take_the_reference_path(
    method: str, tmp_path: Path, pack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _masks_by(method, monkeypatch)
    real = FastEncoder.encode_flat

    def piece_differs(self: FastEncoder, texts: list[str], add_special: bool) -> tuple[np.ndarray, np.ndarray]:
        # A text with MARK (a whole conversation, or its answer's piece) gets one more token: its ids no
        # longer add up to its bytes, and its pieces no longer to the whole.
        ids, starts = real(self, texts, add_special)
        parts = [ids[starts[k] : starts[k + 1]] for k in range(len(texts))]
        parts = [np.append(p, p[:1]) if MARK in t else p for p, t in zip(parts, texts, strict=True)]
        lengths = np.array([0] + [len(p) for p in parts], dtype=np.int64)
        return (np.concatenate(parts) if parts else ids), np.cumsum(lengths)

    monkeypatch.setattr(FastEncoder, "encode_flat", piece_differs)
    conversations = make_conversations(30, seed=5, max_turns=2)
    marked = 0
    for k, messages in enumerate(conversations):
        if k % 3 == 0:
            answer = next(m for m in messages if m["role"] == "assistant")
            answer["content"] = f"{MARK} {answer['content']}"
            marked += 1
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations])
    auto, _ = _pack_both(pack, tmp_path, data)
    assert auto["encoder"] == {"name": "fastokens", "fallback": None, "records_slow": marked}


def test_a_small_input_is_encoded_with_tokenizers_a_large_one_with_the_fast_encoder(
    tmp_path: Path, pack: Any, chat_jsonl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packcli.tokenize.encoders import encoder_choice

    monkeypatch.delenv(ENCODER_ENV)
    size = chat_jsonl.stat().st_size
    small = _summary(pack(chat_jsonl, "-o", tmp_path / "small", "--no-cache", "--num-proc", "2", "--json", "-q"))
    per = encoder_choice.FAST_MIN_BYTES * 2 / 1e6
    assert small["encoder"] == {
        "name": "tokenizers",
        "fallback": f"the input is small ({size / 1e6:.1f} MB, under {per:.0f} MB): tokenizers encodes it in less "
        "time than the fast encoder takes to load",
        "records_slow": 0,
    }
    monkeypatch.setattr(encoder_choice, "FAST_MIN_BYTES", size // 2)  # as if the input were twice the break-even
    large = _summary(pack(chat_jsonl, "-o", tmp_path / "large", "--no-cache", "--num-proc", "1", "--json", "-q"))
    assert large["encoder"] == {"name": "fastokens", "fallback": None, "records_slow": 0}
    assert _shards(tmp_path / "small") == _shards(tmp_path / "large")


def test_the_environment_forces_tokenizers_and_the_cache_key_ignores_the_encoder(
    tmp_path: Path, pack: Any, chat_jsonl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _summary(pack(chat_jsonl, "-o", tmp_path / "a", "--encoder", "tokenizers", "--json", "--quiet"))
    assert first["cache"] == "miss"
    second = _summary(pack(chat_jsonl, "-o", tmp_path / "b", "--seed", "3", "--json", "--quiet"))
    assert second["cache"] == "hit"  # the tokens are the same whichever encoder made them
    assert second["encoder"]["name"] == "tokenizers"  # the entry's: the encoder that made its tokens
    monkeypatch.setenv(ENCODER_ENV, "tokenizers")
    third = _summary(pack(chat_jsonl, "-o", tmp_path / "c", "--no-cache", "--json", "--quiet"))
    assert third["encoder"] == {"name": "tokenizers", "fallback": f"{ENCODER_ENV}=tokenizers", "records_slow": 0}
    assert _shards(tmp_path / "a") == _shards(tmp_path / "c")


def test_verify_reencode_finds_labels_tokenizers_would_not_give(
    tmp_path: Path, pack: Any, chat_jsonl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from packcli.cli import app

    pack(chat_jsonl, "-o", tmp_path / "good", "--no-cache", "--quiet", "--max-len", "512")
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "good"), "--reencode", "3"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("re-encoded 3 rows (")
    # A fast encoder whose masks are one token late, with the probe that would have caught it skipped:
    # the output is whole (checksums, counts, row contract) and only re-encoding finds it.
    real = FastEncoder.masked_or_none

    def late(self: FastEncoder, items: list[Any]) -> list[Any]:
        return [None if m is None else (m[0], np.roll(m[1], 1)) for m in real(self, items)]

    _fresh_fast_encoders(monkeypatch)
    monkeypatch.setattr(FastEncoder, "probe", lambda self, reference: None)
    monkeypatch.setattr(FastEncoder, "masked_or_none", late)
    pack(chat_jsonl, "-o", tmp_path / "bad", "--no-cache", "--quiet", "--max-len", "512")
    assert CliRunner().invoke(app, ["verify", str(tmp_path / "bad")]).exit_code == 0
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "bad"), "--reencode", "3"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    for line in lines[:-1]:
        assert re.fullmatch(
            r"shard-00000-of-00001\.parquet: row \d+: sample \d+ \(piece 0\) differs from its "
            r"encoding by tokenizers",
            line,
        ), line
    assert lines[-1] == f"{len(lines) - 1} problems in {tmp_path / 'bad'}"


def test_what_a_run_learns_of_the_fast_encoder_is_kept_and_not_learned_again(
    tmp_path: Path, pack: Any, chat_jsonl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packcli.tokenize.encoders import encoder_choice, probe, text_encoders

    cache = tmp_path / "cache"
    encoder_choice._loaded.cache_clear()  # what this process loaded before: the facts must come from the cache
    first = _summary(pack(chat_jsonl, "-o", tmp_path / "a", "--cache-dir", cache, "--json", "-q"))
    assert first["encoder"] == {"name": "fastokens", "fallback": None, "records_slow": 0}
    assert len(list((cache / "tokenizers").glob("*.encoder.npz"))) == 1

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("learned again")

    monkeypatch.setattr(probe, "probe_differences", never)
    monkeypatch.setattr(text_encoders, "token_byte_lengths", never)
    encoder_choice._loaded.cache_clear()
    for entry in cache.iterdir():
        if entry.is_dir() and entry.name != "tokenizers":
            shutil.rmtree(entry)  # tokenized again, by the fast encoder the facts vouch for
    second = _summary(pack(chat_jsonl, "-o", tmp_path / "b", "--cache-dir", cache, "--json", "-q"))
    assert second["cache"] == "miss" and second["encoder"] == first["encoder"]
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b")


@pytest.mark.parametrize("family", ["deepseek", "gemma3"])  # byte-level BPE, and not
def test_a_tokenizers_settings_are_read_without_its_model(
    family: str, own_tokenizer: Callable[[str], tuple[str, Any]]
) -> None:
    # Both readers of tokenizer.json decide on its settings before they decode its model (Gemma 3's: 0.4 s).
    text = (Path(own_tokenizer(family)[0]) / "tokenizer.json").read_text(encoding="utf-8")
    wanted = ("normalizer", "truncation", "pre_tokenizer", "added_tokens")
    whole = json.loads(text)
    assert tokenizer_settings(text, wanted) == {key: whole.get(key) for key in wanted}
    cut = text[: text.rindex('"model"')] + '"model": {not JSON'
    assert tokenizer_settings(cut, wanted) == {key: whole.get(key) for key in wanted}  # the model is not read
    # The model first: what the two readers make of the text decoded whole, as they read it before.
    model_first = json.dumps({"model": whole.pop("model"), **whole})
    assert max_token_bytes(text) == max_token_bytes(model_first)
    lengths, whole_lengths = token_byte_lengths(text), token_byte_lengths(model_first)
    assert (lengths is None and whole_lengths is None) or np.array_equal(lengths, whole_lengths)
    assert (lengths is None) == (family == "gemma3")
    # A member after the model, or missing: the text is decoded whole (and refused where it is no JSON).
    after = json.dumps({"model": {"type": "BPE"}, "normalizer": {"type": "NFC"}}, indent=2)
    assert tokenizer_settings(after, ("normalizer", "truncation")) == {
        "normalizer": {"type": "NFC"},
        "truncation": None,
    }
    with pytest.raises(json.JSONDecodeError):
        tokenizer_settings('{"model": {not JSON', ("normalizer",))
    # Named again after the model: the last one holds, as in tokenizers and json (and a vocabulary entry of
    # that name changes nothing).
    twice = '{"normalizer": null, "model": {"vocab": {"normalizer": 0}}, "normalizer": {"type": "NFC"}}'
    assert tokenizer_settings(twice, ("normalizer",)) == {"normalizer": {"type": "NFC"}}
    entry = '{"normalizer": null, "model": {"vocab": {"normalizer": 0}}}'
    assert tokenizer_settings(entry, ("normalizer",)) == {"normalizer": None}


def test_a_tokenizer_the_fast_encoder_cannot_serve_is_remembered(
    tmp_path: Path, pack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fastokens

    from packcli.tokenize.encoders import encoder_choice, text_encoders

    spec = json.loads((Path(default_tokenizer_dir()) / "tokenizer.json").read_text(encoding="utf-8"))
    spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(json.dumps(spec))
    cache = tmp_path / "cache"
    encoder_choice._loaded.cache_clear()
    first = choose(backend, backend.to_str, facts=cache)
    assert first.fallback == "the tokenizer's post-processor trims offsets, which label masks follow"

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("built again")

    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", never)
    monkeypatch.setattr(text_encoders.FastEncoder, "load", never)
    encoder_choice._loaded.cache_clear()
    again = choose(backend, backend.to_str, facts=cache)
    assert (again.encoder.name, again.fallback) == ("tokenizers", first.fallback)


def byte_level_mask(ids: Any, text: str, spans: list[tuple[int, int]], lengths: Any) -> Any:
    """One text's mask by ``byte_level_masks`` (a batch of one)."""
    from packcli.tokenize.encoders.byte_offsets import byte_level_masks

    return byte_level_masks(ids, np.array([0, len(ids)]), [(text, spans)], lengths)[0]


@given(
    pieces=st.lists(st.sampled_from(["a", "é", "中", "😀", " ", "\n", "ab", "x̃"]), min_size=1, max_size=30),
    cuts=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=30),
    spans=st.lists(st.tuples(st.integers(-2, 40), st.integers(-2, 40)), max_size=4),
)
@settings(max_examples=150, deadline=None)
def test_byte_level_masks_are_the_character_overlap_rule(pieces: list[str], cuts: list[int], spans: list[Any]) -> None:
    """Tokens as runs of UTF-8 bytes (some cutting a character): a token is trained when the characters
    holding its first to its last byte overlap a span, as the offset rule says."""

    text = "".join(pieces)
    data = text.encode("utf-8")
    sizes, at, k = [], 0, 0
    while at < len(data):
        size = min(cuts[k % len(cuts)], len(data) - at)
        sizes.append(size)
        at, k = at + size, k + 1
    ids = np.arange(len(sizes))
    lengths = np.asarray(sizes, dtype=np.int64)
    char_of_byte = [i for i, ch in enumerate(text) for _ in ch.encode("utf-8")]
    ends = np.cumsum(sizes)
    expected = [
        any(char_of_byte[e - s] < b and char_of_byte[e - 1] + 1 > a for a, b in spans if b > a)
        for s, e in zip(sizes, ends, strict=True)
    ]
    mask = byte_level_mask(ids, text, spans, lengths)
    assert mask is not None and mask.tolist() == expected
    assert byte_level_mask(ids, text + "z", spans, lengths) is None  # the ids no longer add up to the bytes


def _byte_tokens(text: str, cuts: list[int], first_id: int) -> tuple[list[int], list[int]]:
    """A text's UTF-8 bytes cut into tokens of the ``cuts``' sizes in turn: (ids from ``first_id``, sizes)."""
    sizes, at, k, n = [], 0, 0, len(text.encode("utf-8"))
    while at < n:
        size = min(cuts[k % len(cuts)], n - at)
        sizes.append(size)
        at, k = at + size, k + 1
    return list(range(first_id, first_id + len(sizes))), sizes


@given(
    texts=st.lists(st.text(alphabet="aé中😀 \nx̃", max_size=12), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=8),
    spans=st.lists(st.tuples(st.integers(-2, 14), st.integers(-2, 14)), max_size=3),
    broken=st.integers(min_value=0, max_value=5),
)
@settings(max_examples=150, deadline=None)
def test_a_batch_of_byte_level_masks_is_each_text_alone(
    texts: list[str], cuts: list[int], spans: list[Any], broken: int
) -> None:
    """The masks of a batch (its byte ends summed over every text) are each text's own; a text with an id
    out of the table, a byteless token or bytes that do not add up gets None, and only that text."""
    from packcli.tokenize.encoders.byte_offsets import byte_level_masks

    ids: list[int] = []
    sizes: list[int] = []
    starts = [0]
    for text in texts:
        mine, theirs = _byte_tokens(text, cuts, len(sizes))
        ids += mine
        sizes += theirs
        starts.append(len(ids))
    lengths = np.asarray([*sizes, 0], dtype=np.int64)  # the last id covers no byte
    flat = np.asarray(ids, dtype=np.int64)
    k = broken % len(texts)
    if starts[k + 1] > starts[k]:  # one text's first token made out of the table, byteless, or cut short
        flat[starts[k]] = (len(lengths) + 3, len(lengths) - 1, -1)[broken % 3]
    items = [(text, list(spans)) for text in texts]
    got = byte_level_masks(flat, np.asarray(starts), items, lengths)
    for j, (text, mine) in enumerate(items):
        alone = byte_level_mask(flat[starts[j] : starts[j + 1]].copy(), text, mine, lengths)
        if j == k and starts[k + 1] > starts[k]:
            assert got[j] is None and alone is None
            continue
        assert alone is not None and got[j] is not None
        assert got[j].tolist() == alone.tolist()
