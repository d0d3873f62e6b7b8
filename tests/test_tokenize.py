"""Exactness: token ids equal apply_chat_template's, label masks equal its assistant masks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from packcli.contract import IGNORE_INDEX
from packcli.errors import RecordError, TokenizerError
from packcli.records.formats import Sample
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder
from packcli.tokenize.templates.choice import builtin_template

from .conftest import TEMPLATES, make_conversations

# (template used by packcli, template with generation blocks whose masks are the reference)
TEMPLATE_PAIRS = {
    "chatml-generation": ("chatml", "chatml"),
    "llama3-no-generation": ("llama3.jinja", "llama3_generation.jinja"),
    "mistral-no-generation": ("mistral.jinja", "mistral_generation.jinja"),
    "llama3-generation": ("llama3_generation.jinja", "llama3_generation.jinja"),
}


def _template(name: str) -> str:
    return builtin_template("chatml") if name == "chatml" else (TEMPLATES / name).read_text()


def _template_file(name: str, tmp_path: Path) -> str:
    path = tmp_path / (name if name.endswith(".jinja") else name + ".jinja")
    path.write_text(_template(name))
    return str(path)


def _reference(tokenizer: Any, messages: list[dict[str, str]], template: str) -> tuple[list[int], list[int]]:
    out = tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


def _check_parity(encoder: Encoder, tokenizer: Any, conversations: list[Any], reference_template: str) -> None:
    results = encoder.encode_batch([Sample("chat", messages=m) for m in conversations])
    for messages, result in zip(conversations, results, strict=True):
        assert not isinstance(result, RecordError), result
        ids, labels = result
        ref_ids, _ = _reference(tokenizer, messages, encoder.template)
        assert ids.tolist() == ref_ids
        _, mask = _reference(tokenizer, messages, reference_template)
        expected = np.where(np.array(mask, dtype=bool), np.array(ref_ids), IGNORE_INDEX)
        expected[0] = IGNORE_INDEX
        assert labels.tolist() == expected.tolist()
        assert (labels != IGNORE_INDEX).any()


@pytest.mark.parametrize("pair", list(TEMPLATE_PAIRS))
def test_ids_and_masks_equal_apply_chat_template(pair: str, base_tokenizer: Any, tmp_path: Path) -> None:
    used, reference = TEMPLATE_PAIRS[pair]
    encoder = Encoder(None, _template_file(used, tmp_path), EncodeOptions())
    assert encoder.has_generation_blocks == ("generation" in used or used == "chatml")
    _check_parity(encoder, base_tokenizer, make_conversations(40, seed=3), _template(reference))


def test_tokenizer_with_own_template_and_special_tokens(llama3_tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llama3_tokenizer_dir)
    encoder = Encoder(str(llama3_tokenizer_dir), None, EncodeOptions())
    assert encoder.template_source == "tokenizer"
    assert not encoder.has_generation_blocks
    conversations = make_conversations(25, seed=4)
    _check_parity(encoder, tokenizer, conversations, _template("llama3_generation.jinja"))
    ids, _ = encoder.encode_batch([Sample("chat", messages=conversations[0])])[0]
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert eot in ids.tolist()  # the added tokens are single ids, as in the model's own tokenizer


message_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(st.tuples(message_text, message_text), min_size=1, max_size=3),
    system=st.one_of(st.none(), message_text),
)
def test_parity_on_arbitrary_unicode(turns: list[tuple[str, str]], system: str | None, base_tokenizer: Any) -> None:
    messages = [{"role": "system", "content": system}] if system else []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    encoder = _chatml_encoder()
    _check_parity(encoder, base_tokenizer, [messages], builtin_template("chatml"))
    # The default pair: the default tokenizer with its own markers' template (no --chat-template).
    if "default" not in _ENCODERS:
        _ENCODERS["default"] = Encoder(None, None, EncodeOptions())
    assert _ENCODERS["default"].template == builtin_template("deepseek")
    _check_parity(_ENCODERS["default"], base_tokenizer, [messages], builtin_template("deepseek"))


_ENCODERS: dict[str, Encoder] = {}


def _chatml_encoder(train_on: str = "auto") -> Encoder:
    if train_on not in _ENCODERS:
        _ENCODERS[train_on] = Encoder(None, "chatml", EncodeOptions(train_on=train_on))
    return _ENCODERS[train_on]


def test_train_on_modes(base_tokenizer: Any) -> None:
    messages = make_conversations(30, seed=5)
    multi = next(m for m in messages if sum(x["role"] == "assistant" for x in m) >= 2)
    ids, all_labels = _chatml_encoder("all").encode_batch([Sample("chat", messages=multi)])[0]
    assert all_labels[0] == IGNORE_INDEX and (all_labels[1:] == ids[1:]).all()
    _, assistant = _chatml_encoder("assistant").encode_batch([Sample("chat", messages=multi)])[0]
    _, last = _chatml_encoder("last_assistant").encode_batch([Sample("chat", messages=multi)])[0]
    trained_assistant = assistant != IGNORE_INDEX
    trained_last = last != IGNORE_INDEX
    assert trained_last.sum() < trained_assistant.sum()
    assert not (trained_last & ~trained_assistant).any()
    # The last turn's tokens are a suffix block of the trained tokens.
    assert trained_last[np.flatnonzero(trained_last)[0] :].all()


def test_prompt_completion_strings_train_on_completion_and_append_eos(base_tokenizer: Any) -> None:
    encoder = _chatml_encoder()
    ids, labels = encoder.encode_batch([Sample("prompt_completion", prompt="Q: two plus two?", completion=" A: 4")])[0]
    assert ids[-1] == base_tokenizer.eos_token_id and labels[-1] == base_tokenizer.eos_token_id
    assert base_tokenizer.decode(ids[:-1]) == "Q: two plus two? A: 4"
    trained = base_tokenizer.decode(ids[labels != IGNORE_INDEX])
    assert trained == " A: 4" + base_tokenizer.eos_token
    ids2, labels2 = encoder.encode_batch([Sample("text", text="plain text")])[0]
    assert ids2[-1] == base_tokenizer.eos_token_id and (labels2[1:] == ids2[1:]).all()


def test_conversational_prompt_completion_trains_on_completion_only() -> None:
    encoder = _chatml_encoder()
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "final answer"},
    ]
    ids, labels = encoder.encode_batch([Sample("chat", messages=messages, prompt_len=3)])[0]
    trained = encoder.tokenizer.decode(ids[labels != IGNORE_INDEX])
    # This tokenizer has no ChatML tokens: the last piece of "<|im_end|>" merges with the newline after it,
    # and a token overlapping the generation block is trained on (the rule of apply_chat_template).
    assert trained == "final answer<|im_end|>\n"


def test_record_errors_are_reasons_not_exceptions() -> None:
    encoder = _chatml_encoder()
    results = encoder.encode_batch(
        [
            Sample("chat", messages=[{"role": "user", "content": "no answer"}]),
            Sample("tokenized", input_ids=[1, 2, 10**9]),
            Sample("tokenized", input_ids=[5, 6, 7], labels=[-100, 9, 7]),
            Sample("text", text=""),
            Sample("tokenized", input_ids=[5], labels=None),
        ]
    )
    reasons = [r.reason if isinstance(r, RecordError) else "ok" for r in results]
    # A one-token sample has nothing to train on: its only token is a first token, which never is.
    assert reasons == ["no_assistant_turn", "token_out_of_range", "bad_labels", "empty", "nothing_to_train"]


def test_template_that_raises_is_a_record_error(tmp_path: Path) -> None:
    encoder = Encoder(None, _template_file("mistral.jinja", tmp_path), EncodeOptions())
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "x"},
        {"role": "assistant", "content": "y"},
    ]
    result = encoder.encode_batch([Sample("chat", messages=messages)])[0]
    assert isinstance(result, RecordError) and result.reason == "template_error"
    assert "roles must be system, user or assistant" in result.detail


def test_bad_tokenizer_and_template_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"cannot load tokenizer '.*nope'.*check the path"):
        Encoder(str(tmp_path / "nope"), None, EncodeOptions())
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    with pytest.raises(TokenizerError, match="does not compile"):
        Encoder(None, str(bad), EncodeOptions())


def test_fast_loading_path_equals_autotokenizer(base_tokenizer: Any, llama3_tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    from packcli.tokenize.encoders.tokenizer import load_tokenizer

    for source, reference in ((None, base_tokenizer), (str(llama3_tokenizer_dir), None)):
        reference = reference or AutoTokenizer.from_pretrained(source)
        loaded = load_tokenizer(source)
        assert type(loaded) is type(reference)
        assert loaded.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()
        assert loaded.special_tokens_map == reference.special_tokens_map
        assert loaded.chat_template == reference.chat_template


@given(
    samples=st.lists(
        st.lists(st.booleans(), min_size=1, max_size=40).filter(any),  # every sample trains a token
        min_size=1,
        max_size=12,
    )
)
@settings(max_examples=150, deadline=None)
def test_label_stats_count_and_find_each_samples_first_trained_token(samples: list[list[bool]]) -> None:
    """A batch's per-sample trained counts and first trained positions, from one pass over its labels."""
    from packcli.tokenize.batches.worker import label_stats

    labels = np.asarray([7 if on else IGNORE_INDEX for sample in samples for on in sample], dtype=np.int32)
    lengths = np.asarray([len(sample) for sample in samples], dtype=np.int64)
    counts, first = label_stats(labels, lengths)
    assert counts.tolist() == [sum(sample) for sample in samples]
    assert first.tolist() == [sample.index(True) for sample in samples]
    assert counts.dtype == np.int32 and first.dtype == np.int32
