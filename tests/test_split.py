"""``--overflow split``: long records become whole, exact pieces; ``--truncate-side``; loss made loud.

Every piece of a conversation must be ``apply_chat_template`` of a run of whole exchanges of it (the
system message first, unless ``--split-system first``), the runs must follow each other and cover the
conversation, each must be as long as fits, and its labels must be what packcli gives the same
messages as a record of their own. Text chunks must concatenate back to the document's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.contract import IGNORE_INDEX
from packcli.records.formats import Sample
from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder
from packcli.tokenize.long.split import SplitRule, split_chat

from .conftest import make_conversations, read_rows, trl_templates, write_jsonl

MAX_LEN = 160


def _exchanges(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """The test's own reading of the rule: leading system messages, then runs cut before a user after an assistant."""
    head = [m for m in messages[: next(i for i, m in enumerate(messages) if m["role"] != "system")]]
    body = messages[len(head) :]
    runs: list[list[dict[str, Any]]] = [[]]
    for k, m in enumerate(body):
        if k and m["role"] == "user" and body[k - 1]["role"] == "assistant":
            runs.append([])
        runs[-1].append(m)
    return head, runs


def _tool_conversation(k: int) -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"q": f"item {k}"}}}
    return [
        {"role": "system", "content": "You can look things up."},
        {"role": "user", "content": f"Find item {k} " + "please " * 20},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "lookup", "content": f"item {k} is blue " * 8},
        {"role": "assistant", "content": f"Item {k} is blue. " + "indeed " * 25},
        {"role": "user", "content": "And the next one? " + "thanks " * 15},
        {"role": "assistant", "content": "Also blue. " + "sure " * 30},
        {"role": "user", "content": "Last question " + "why " * 12},
        {"role": "assistant", "content": "Because. " + "so " * 20},
    ]


def _conversations() -> list[list[dict[str, Any]]]:
    many = [m for m in make_conversations(80, seed=5, max_turns=8, max_words=50) if len(m) >= 6]
    return many[:12]


# (template file name or None for packcli's default for the tokenizer, with tool turns?)
TEMPLATES = [
    (None, True),
    ("qwen3", True),
    ("llama3", False),
    ("deepseekv3", False),
    ("phi3", False),
    ("gptoss", False),
]


@pytest.mark.parametrize(("name", "tools"), TEMPLATES, ids=[t[0] or "default" for t in TEMPLATES])
@pytest.mark.parametrize("system", ["all", "first"])
def test_pieces_are_the_template_applied_to_runs_of_whole_exchanges(
    name: str | None, tools: bool, system: str, model_tokenizer: tuple[str, Any]
) -> None:
    tok_dir, tokenizer = model_tokenizer
    template = None if name is None else str(trl_templates() / f"{name}.jinja")
    encoder = Encoder(tok_dir, template, EncodeOptions())
    text = encoder.template if template is None else Path(template).read_text()
    conversations = _conversations() + ([_tool_conversation(k) for k in range(3)] if tools else [])
    rule = SplitRule(MAX_LEN, system)
    split_seen = 0
    for messages in conversations:
        sample = Sample("chat", messages=messages)
        whole = encoder.encode_batch([sample])[0]
        pieces = split_chat(sample, "auto", rule, lambda s: encoder.encode_batch([s])[0])
        head, runs = _exchanges(messages)

        def ids_of(a: int, b: int, first: bool, head: Any = head, runs: Any = runs) -> list[int]:
            msgs = (head if system == "all" or first else []) + [m for run in runs[a:b] for m in run]
            return list(tokenizer.apply_chat_template(msgs, chat_template=text, tokenize=True, return_dict=False))

        if len(whole[0]) > MAX_LEN:
            split_seen += 1
        a = 0
        for ids, labels in pieces.pieces:
            b = next((b for b in range(a + 1, len(runs) + 1) if ids_of(a, b, a == 0) == ids.tolist()), None)
            assert b is not None, f"{name}: a piece is not the template applied to whole exchanges from {a}"
            if b - a > 1:
                assert len(ids) <= MAX_LEN  # only one exchange alone may be longer
            if b < len(runs):
                assert len(ids_of(a, b + 1, a == 0)) > MAX_LEN, f"{name}: the piece {a}:{b} could hold one more"
            msgs = (head if system == "all" or a == 0 else []) + [m for run in runs[a:b] for m in run]
            alone = encoder.encode_batch([Sample("chat", messages=msgs)])[0]
            np.testing.assert_array_equal(labels, alone[1])  # the labels of the same messages as a record
            assert labels[0] == IGNORE_INDEX
            a = b
        assert a == len(runs), f"{name}: the pieces stop at exchange {a} of {len(runs)}"
        assert not pieces.left_out
    assert split_seen >= 5


def test_default_template_piece_labels_equal_the_assistant_masks(base_tokenizer: Any) -> None:
    """With generation blocks, a piece's labels are apply_chat_template's assistant mask of its messages."""
    encoder = Encoder(None, None, EncodeOptions())
    template = encoder.template  # the default tokenizer's own markers' template, with generation blocks
    for messages in _conversations():
        sample = Sample("chat", messages=messages)
        pieces = split_chat(sample, "auto", SplitRule(MAX_LEN), lambda s: encoder.encode_batch([s])[0])
        head, runs = _exchanges(messages)
        a = 0
        for ids, labels in pieces.pieces:
            for b in range(a + 1, len(runs) + 1):
                msgs = head + [m for run in runs[a:b] for m in run]
                ref = base_tokenizer.apply_chat_template(
                    msgs, chat_template=template, return_dict=True, return_assistant_tokens_mask=True
                )
                if ref["input_ids"] == ids.tolist():
                    mask = np.asarray(ref["assistant_masks"], dtype=bool)
                    mask[0] = False
                    np.testing.assert_array_equal(labels != IGNORE_INDEX, mask)
                    break
            else:
                pytest.fail("a piece is not the template applied to whole exchanges")
            a = b
        assert a == len(runs)


def test_last_assistant_keeps_the_last_answer_with_the_most_context(model_tokenizer: tuple[str, Any]) -> None:
    tok_dir, _ = model_tokenizer
    encoder = Encoder(tok_dir, None, EncodeOptions(train_on="last_assistant"))
    messages = [
        *_tool_conversation(1),
        {"role": "user", "content": "one more " * 10},
        {"role": "assistant", "content": "the final answer " * 10},
    ]
    sample = Sample("chat", messages=messages)
    pieces = split_chat(sample, "last_assistant", SplitRule(MAX_LEN), lambda s: encoder.encode_batch([s])[0])
    assert len(pieces.pieces) == 1  # only the piece with the last answer is trained; the others are left out
    assert pieces.left_out["untrained_piece"] >= 1
    ids, labels = pieces.pieces[0]
    trained = encoder.tokenizer.decode(ids[labels != IGNORE_INDEX])
    assert "the final answer" in trained and "Because." not in trained
    assert len(ids) <= MAX_LEN


def test_split_end_to_end_keeps_every_answer_and_counts(tmp_path: Path, pack: Any) -> None:
    conversations = _conversations()
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations])
    out = tmp_path / "out"
    result = pack(data, "--max-len", MAX_LEN, "--overflow", "split", "-o", out, "--json", "-q")
    summary = json.loads(result.stdout)
    assert summary["dropped"] == {} and summary["packed"] == len(conversations)
    split = summary["split"]
    assert split["records_split"] >= 5 and split["pieces_left_out"] == {}
    rows = read_rows(out)
    pairs = [(i, p) for row in rows for i, p in zip(row["sample_index"], row["piece_index"], strict=True)]
    assert len(pairs) == len(set(pairs)) == summary["samples"]
    by_record: dict[int, list[int]] = {}
    for i, p in pairs:
        by_record.setdefault(i, []).append(p)
    assert sorted(by_record) == list(range(len(conversations)))
    assert all(sorted(ps) == list(range(len(ps))) for ps in by_record.values())
    assert sum(len(ps) - 1 for ps in by_record.values() if len(ps) > 1) == split["pieces"] - split["records_split"]
    # No answer is lost: every assistant message's words are trained somewhere (the tokenizer is byte-level,
    # so decoding the trained tokens of a record's pieces shows every answer).
    from packcli.tokenize.encoders.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    trained: dict[int, str] = {}
    for row in rows:
        start = 0
        for i, n in zip(row["sample_index"], row["seq_lengths"], strict=True):
            ids = np.asarray(row["input_ids"][start : start + n])
            labels = np.asarray(row["labels"][start : start + n])
            trained[i] = trained.get(i, "") + tokenizer.decode(ids[labels != IGNORE_INDEX])
            start += n
    for i, messages in enumerate(conversations):
        for m in messages:
            if m["role"] == "assistant":
                assert m["content"].strip()[:20] in trained[i]
    verify = CliRunner().invoke(app, ["verify", str(out)])
    assert verify.exit_code == 0, verify.stderr
    stats = json.loads(CliRunner().invoke(app, ["stats", str(out), "--json"]).stdout)
    assert (stats["samples"], stats["records"]) == (summary["samples"], summary["packed"])
    assert stats["lower_bound_l2"] == summary["lower_bound_l2"]  # pieces are separate samples in the bounds


def test_text_chunks_concatenate_back_and_min_piece(tmp_path: Path, pack: Any, base_tokenizer: Any) -> None:
    doc = " ".join(f"word{k}" for k in range(700))
    data = write_jsonl(tmp_path / "text.jsonl", [{"text": doc}, {"text": "short one"}])
    out = tmp_path / "out"
    summary = json.loads(
        pack(data, "--max-len", 128, "--overflow", "split", "-o", out, "--json", "-q", "--rows-per-shard", 1000).stdout
    )
    rows = read_rows(out)
    chunks: dict[int, tuple[list[int], list[int]]] = {}
    for row in rows:
        start = 0
        for i, p, n in zip(row["sample_index"], row["piece_index"], row["seq_lengths"], strict=True):
            if i == 0:
                chunks[p] = (row["input_ids"][start : start + n], row["labels"][start : start + n])
            start += n
    ids = [t for p in sorted(chunks) for t in chunks[p][0]]
    expected = base_tokenizer(doc)["input_ids"] + [base_tokenizer.eos_token_id]
    assert ids == expected  # BOS where the tokenizer puts it, EOS at the end only
    assert all(len(c[0]) <= 128 for c in chunks.values())
    assert all(c[1][0] == IGNORE_INDEX for c in chunks.values())
    assert all(c[1][1:] == c[0][1:] for c in chunks.values())  # every other token trained
    tail = len(expected) % 128
    assert tail > 0 and summary["split"]["pieces"] == len(chunks)

    again = tmp_path / "again"
    summary = json.loads(
        pack(data, "--max-len", 128, "--overflow", "split", "--min-piece", tail + 1, "-o", again, "--json", "-q").stdout
    )
    assert summary["split"]["pieces_left_out"] == {"piece_too_short": 1}
    assert summary["split"]["pieces"] == len(chunks) - 1


def test_truncate_left_keeps_the_end_and_the_completion(tmp_path: Path, pack: Any, base_tokenizer: Any) -> None:
    prompt = " ".join(f"context{k}" for k in range(300))
    completion = " the answer is forty two"
    data = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": prompt, "completion": completion}])
    out = tmp_path / "out"
    for side in ("right", "left"):
        target = out / side
        result = pack(
            data,
            "--max-len",
            64,
            "--overflow",
            "truncate",
            "--truncate-side",
            side,
            "-o",
            target,
            "--json",
            "-q",
            expect=None,
        )
        if side == "right":  # the completion is beyond the first 64 tokens: nothing left to train
            assert result.exit_code == 1 and "no sample left to pack" in result.stderr
            continue
        summary = json.loads(result.stdout)
        assert summary["truncated"] == 1
        (row,) = read_rows(target)
        whole = base_tokenizer(prompt + completion)["input_ids"] + [base_tokenizer.eos_token_id]
        assert row["input_ids"] == whole[-64:]  # the last 64 tokens, cut at a token boundary
        labels = np.asarray(row["labels"])
        assert labels[0] == IGNORE_INDEX
        trained = base_tokenizer.decode(np.asarray(row["input_ids"])[labels != IGNORE_INDEX])
        assert trained.strip().startswith("the answer is forty two")
        assert summary["trainable_tokens"] == int((labels != IGNORE_INDEX).sum())


def test_loss_is_loud_and_max_drop_fraction_fails(tmp_path: Path, pack: Any) -> None:
    # One exchange longer than a row, whatever the template's markers cost.
    too_long = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "many words " * 90}]
    conversations = _conversations() + make_conversations(30, seed=2, max_turns=1, max_words=10) + [too_long]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations])
    result = pack(data, "--max-len", MAX_LEN, "-o", tmp_path / "out")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1, result.stderr
    assert "top reason too_long" in warnings[0] and "--overflow split" in warnings[0]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["warnings"] == [warnings[0].removeprefix("Warning: ")]
    assert manifest["lost"]["records"] == manifest["counts"]["dropped"]["too_long"]

    failed = pack(data, "--max-len", MAX_LEN, "-o", tmp_path / "strict", "--max-drop-fraction", 0.05, expect=1)
    (line,) = [x for x in failed.stderr.splitlines() if x.strip()]
    assert line.startswith("Error: ") and "more than --max-drop-fraction 0.05" in line
    assert not (tmp_path / "strict").exists()
    split = ["--overflow", "split", "--max-drop-fraction", 0.05, "--json", "-q"]
    kept = json.loads(pack(data, "--max-len", MAX_LEN, "-o", tmp_path / "split", *split).stdout)
    assert kept["warnings"] == [] and kept["dropped"] == {}
    assert 0 < kept["lost"]["tokens_fraction"] <= 0.05  # one exchange longer than a row, truncated
    assert kept["lost"]["tokens_by_reason"].keys() == {"truncated"} and kept["truncated"] >= 1


def test_stats_shows_what_each_policy_keeps_as_pack_would(tmp_path: Path, pack: Any, cache_dir: Path) -> None:
    conversations = _conversations() + make_conversations(20, seed=3, max_turns=1, max_words=10)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations])
    result = CliRunner().invoke(
        app, ["stats", str(data), "--max-len", f"{MAX_LEN},100000", "--json", "--cache-dir", str(cache_dir)]
    )
    assert result.exit_code == 0, result.stderr
    short, long = json.loads(result.stdout)["max_lens"]
    policies = short["policies"]
    assert list(policies) == ["drop", "truncate", "truncate-left", "split"]
    trained = [policies[p]["trainable_tokens"] for p in ("drop", "truncate", "split")]
    assert trained[0] < trained[1] < trained[2]
    assert len({tuple(p.values()) for p in long["policies"].values()}) == 1  # nothing too long: all the same
    assert long["policies"]["drop"]["trainable_fraction"] == 1.0
    for policy, flags in (
        ("split", ["--overflow", "split"]),
        ("truncate-left", ["--overflow", "truncate", "--truncate-side", "left"]),
        ("drop", []),
    ):
        out = tmp_path / policy
        summary = json.loads(pack(data, "--max-len", MAX_LEN, *flags, "-o", out, "--json", "-q").stdout)
        expect = policies[policy]
        assert (summary["packed"], summary["samples"], summary["trainable_tokens"]) == (
            expect["records"],
            expect["samples"],
            expect["trainable_tokens"],
        ), policy
        if policy == "split":
            assert summary["cache"] == "hit"  # stats tokenized the pieces into the cache


def test_the_cut_is_found_with_few_encodes(model_tokenizer: tuple[str, Any]) -> None:
    """Many short exchanges: the search starts from the record's own tokens per character, so each piece
    costs about two encodes (itself and one exchange more), not one per exchange."""
    tok_dir, _ = model_tokenizer
    encoder = Encoder(tok_dir, None, EncodeOptions())
    messages = [{"role": "system", "content": "Be brief."}]
    for k in range(60):
        messages += [
            {"role": "user", "content": f"q{k} " * (3 + k % 5)},
            {"role": "assistant", "content": f"a{k} " * 6},
        ]
    sample = Sample("chat", messages=messages)
    whole = encoder.encode_batch([sample])[0]
    calls = []

    def encode(piece: Sample) -> Any:
        calls.append(len(piece.messages or []))
        return encoder.encode_batch([piece])[0]

    pieces = split_chat(sample, "auto", SplitRule(512), encode, len(whole[0]))
    assert len(pieces.pieces) >= 4
    assert len(calls) <= 4 * len(pieces.pieces), (len(calls), len(pieces.pieces))
    # and the pieces are still as long as fit: the cuts a plain search, one exchange at a time, finds
    head, runs = _exchanges(messages)

    def tokens(a: int, b: int) -> np.ndarray:
        return encoder.encode_batch([Sample("chat", messages=head + [m for r in runs[a:b] for m in r])])[0][0]

    expected, a = [], 0
    while a < len(runs):
        b = a + 1
        while b < len(runs) and len(tokens(a, b + 1)) <= 512:
            b += 1
        expected.append(tokens(a, b).tolist())
        a = b
    assert [p[0].tolist() for p in pieces.pieces] == expected


def test_truncate_left_keeps_the_last_answer_of_a_conversation(tmp_path: Path, pack: Any) -> None:
    messages = [
        {"role": "system", "content": "be kind " * 10},
        {"role": "user", "content": "first question " * 30},
        {"role": "assistant", "content": "first answer " * 40},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "the last answer is here"},
    ]
    data = write_jsonl(tmp_path / "c.jsonl", [{"messages": messages}])
    flags = ["--max-len", 64, "--overflow", "truncate", "--json", "-q"]
    left = json.loads(pack(data, *flags, "--truncate-side", "left", "-o", tmp_path / "left").stdout)
    right = pack(data, *flags, "-o", tmp_path / "right", expect=1)  # the head holds no answer
    assert "no sample left to pack" in right.stderr
    from packcli.tokenize.encoders.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)

    def trained(out: Path) -> str:
        (row,) = read_rows(out)
        ids, labels = np.asarray(row["input_ids"]), np.asarray(row["labels"])
        assert labels[0] == IGNORE_INDEX and len(ids) == 64
        return tokenizer.decode(ids[labels != IGNORE_INDEX])

    assert "the last answer is here" in trained(tmp_path / "left")
    assert left["truncated"] == 1 and left["dropped"] == {}


def test_min_piece_tokens_are_lost_counted_and_fail_max_drop_fraction(
    tmp_path: Path, pack: Any, base_tokenizer: Any
) -> None:
    """Chunks left out under --min-piece (and untrained chunks) are tokens lost: counted, loud, and limited."""
    docs = [" ".join(f"w{k * 7 + j}" for j in range(80 + 37 * k)) for k in range(12)]
    data = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs])
    whole = sum(len(base_tokenizer(d)["input_ids"]) + 1 for d in docs)  # + EOS
    flags = ["--max-len", 64, "--overflow", "split", "--min-piece", 60, "--json", "-q"]
    summary = json.loads(pack(data, *flags, "-o", tmp_path / "out").stdout)
    in_shards = sum(len(row["input_ids"]) for row in read_rows(tmp_path / "out"))
    assert summary["tokens"] == in_shards < whole
    lost = summary["lost"]
    assert lost["tokens"] == whole - in_shards == summary["split"]["tokens_left_out"]["piece_too_short"]
    assert lost["tokens_by_reason"] == {"piece_too_short": whole - in_shards}
    assert lost["tokens_fraction"] == round((whole - in_shards) / whole, 6) > 0.05
    assert any("top reason piece_too_short" in w and "--min-piece" in w for w in summary["warnings"])
    failed = pack(data, *flags[:-2], "--max-drop-fraction", 0.05, "-o", tmp_path / "strict", expect=1)
    assert "more than --max-drop-fraction 0.05" in failed.stderr and not (tmp_path / "strict").exists()


def test_split_cuts_an_exchange_too_long_on_its_own_from_the_left_and_keeps_its_answer(
    tmp_path: Path, pack: Any
) -> None:
    """split's fallback keeps the answer by default: the exchange's prompt is cut from the left, the answer's
    labels are all there; --truncate-side right is still the user's to choose (and loses those answers)."""
    long_prompt = " ".join(f"context{k} detail" for k in range(120))
    conversations = [
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": long_prompt},
            {"role": "assistant", "content": "The first answer survives whole."},
        ],
        [
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "Read this: " + long_prompt},
            {"role": "assistant", "content": "The second answer survives too."},
        ],
        [{"role": "user", "content": "short"}, {"role": "assistant", "content": "reply"}],
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations])
    flags = ["--max-len", 128, "--overflow", "split", "--json", "-q", "--rows-per-shard", 1000]
    summary = json.loads(pack(data, *flags, "-o", tmp_path / "out").stdout)
    assert summary["dropped"] == {} and summary["packed"] == 3
    assert (summary["split"]["exchanges_cut"], summary["split"]["cut_side"]) == (2, "left")
    encoder = Encoder(None, None, EncodeOptions())
    # The cut pieces as whole samples: what the template makes of the exchange (with the system message first).
    cut = {0: conversations[0], 1: conversations[1][2:]}
    samples = {}
    for row in read_rows(tmp_path / "out"):
        start = 0
        for i, p, n in zip(row["sample_index"], row["piece_index"], row["seq_lengths"], strict=True):
            samples[(i, p)] = (
                np.asarray(row["input_ids"][start : start + n]),
                np.asarray(row["labels"][start : start + n]),
            )
            start += n
    for record, messages in cut.items():
        ids, labels = samples[(record, 0 if record == 0 else 1)]
        whole_ids, whole_labels = encoder.encode_batch([Sample("chat", messages=messages)])[0]
        assert len(whole_ids) > 128 == len(ids)
        assert ids.tolist() == whole_ids[-128:].tolist()  # cut from the left: the end of the exchange is kept
        assert labels[0] == IGNORE_INDEX
        assert ids[labels != IGNORE_INDEX].tolist() == whole_ids[whole_labels != IGNORE_INDEX].tolist()
        assert "survive" in encoder.tokenizer.decode(ids[labels != IGNORE_INDEX])

    table = pack(data, "--max-len", 128, "--overflow", "split", "-o", tmp_path / "table").stderr
    assert "exchanges cut" in table and "start of the prompt" in " ".join(table.split())
    right = json.loads(pack(data, *flags, "--truncate-side", "right", "-o", tmp_path / "right").stdout)
    assert right["dropped"] == {"nothing_to_train_after_truncation": 1}  # the first record: its answer was cut off
    assert right["split"]["cut_side"] == "right"


def _long_text(words: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    vocab = [
        "packing",
        "row",
        "naïve",
        "café",
        "数据",
        "😀",
        "x=1;",
        "def f():",
        "\n",
        "  ",
        "1234",
        "3.14",
        "—",
        "l'été",
    ]
    return " ".join(rng.choice(vocab) for _ in range(words))


@pytest.mark.parametrize("overflow", ["split", "truncate"])
def test_a_record_certainly_too_long_is_encoded_by_windows_with_the_same_tokens(
    tmp_path: Path, pack: Any, monkeypatch: pytest.MonkeyPatch, overflow: str
) -> None:
    """A record over --max-len x (bytes a token) is encoded a window at a time (bounded memory), and its
    tokens and labels are those of the whole encoding: split writes every token of the text back."""
    from packcli.tokenize.long import long_text

    records = [
        {"text": _long_text(30_000, 1)},
        {"prompt": _long_text(16_000, 2), "completion": _long_text(16_000, 3)},
        {
            "messages": [
                {"role": "system", "content": "be exact"},
                {"role": "user", "content": _long_text(16_000, 4)},
                {"role": "assistant", "content": _long_text(16_000, 5)},
            ]
        },
        {"text": "a short one that fits"},
    ]
    data = [write_jsonl(tmp_path / f"long{k}.jsonl", [r]) for k, r in enumerate(records)]  # a format each
    flags = ["--max-len", 256, "--overflow", overflow, "--no-cache", "--json", "-q", "--rows-per-shard", 100_000]
    if overflow == "truncate":
        flags += ["--truncate-side", "left"]
    joined: list[int] = []
    windows = long_text.encode_windows

    def spy(backend: Any, text: str) -> Any:
        got = windows(backend, text)
        assert got is not None  # joined, not given up on
        joined.append(len(got.ids))
        return got

    monkeypatch.setattr(long_text, "WINDOW_CHARS", 8192)
    monkeypatch.setattr(long_text, "OVERLAP_CHARS", 1024)
    monkeypatch.setattr(long_text, "encode_windows", spy)
    bounded = json.loads(pack(*data, *flags, "-o", tmp_path / "bounded").stdout)
    assert len(joined) >= 3  # each long record (split: and its one long exchange again), by windows
    monkeypatch.setattr(long_text, "WINDOW_CHARS", 1 << 40)  # every text encoded whole, as before
    whole = json.loads(pack(*data, *flags, "-o", tmp_path / "whole").stdout)
    assert read_rows(tmp_path / "bounded") == read_rows(tmp_path / "whole")
    assert {k: v for k, v in bounded.items() if k != "seconds" and "second" not in k and k != "output"} == {
        k: v for k, v in whole.items() if k != "seconds" and "second" not in k and k != "output"
    }
