"""A tokenizer opened from its record is the tokenizer transformers loads (``packcli.tokenize.encoders.recorded``).

The record of the default tokenizer ships with packcli; others are made by the first run that loads them
with transformers and kept in the cache, so that later runs import no transformers.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from packcli.contract import default_tokenizer_dir
from packcli.tokenize.encoders.recorded import (
    RECORDS_DIR,
    RecordedTokenizer,
    TokenizerRecord,
    read_record,
    record_of,
    shipped_record,
)
from packcli.tokenize.encoders.tokenizer import load_tokenizer, open_tokenizer

from .conftest import make_conversations, write_jsonl


def _facts(tokenizer: Any) -> dict[str, Any]:
    """What a run reads of a tokenizer: each must be the same, recorded or loaded."""
    return {
        "backend": tokenizer.backend_tokenizer.to_str(),
        "special_tokens_map": dict(tokenizer.special_tokens_map),
        "added": sorted((i, t.content) for i, t in tokenizer.added_tokens_decoder.items()),
        "all_special": (list(tokenizer.all_special_tokens), list(tokenizer.all_special_ids)),
        "named": [getattr(tokenizer, f"{n}_token{s}") for n in ("bos", "eos", "pad", "unk") for s in ("", "_id")],
        "len": len(tokenizer),
        "vocab": tokenizer.get_vocab(),
        "chat_template": tokenizer.chat_template,
        "decode": tokenizer.decode([5, 6, 7, 1], skip_special_tokens=False, clean_up_tokenization_spaces=False),
        "unknown": tokenizer.convert_tokens_to_ids("no such token at all"),
    }


def test_the_shipped_record_is_what_transformers_gives_for_the_default_tokenizer() -> None:
    directory = Path(default_tokenizer_dir())
    shipped = shipped_record(directory)
    assert shipped is not None
    made = record_of(load_tokenizer(None), directory)
    assert made is not None
    assert dataclasses.replace(shipped, transformers=made.transformers) == made
    assert _facts(RecordedTokenizer(shipped, directory)) == _facts(load_tokenizer(None))


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer whose class transformers rebuilds on load (GPT2Tokenizer: its pre-tokenizer replaced),
    with added special tokens and a chat template file beside its config."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("gpt2-class")
    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.save_pretrained(out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    )
    return out


def test_a_tokenizer_transformers_rebuilds_is_recorded_as_rebuilt(rewritten: Path, tmp_path: Path) -> None:
    loaded = load_tokenizer(str(rewritten))
    record = record_of(loaded, rewritten)
    assert record is not None and record.backend is not None  # not tokenizer.json as it is
    assert record.chat_template is not None
    assert _facts(RecordedTokenizer(record, rewritten)) == _facts(loaded)
    assert TokenizerRecord.from_json(record.to_json()) == record


def test_a_run_records_the_tokenizer_and_the_next_one_opens_it_without_transformers(
    rewritten: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = open_tokenizer(str(rewritten), cache)
    # Loaded by transformers, recorded, and served from the record with transformers' backend.
    assert isinstance(first, RecordedTokenizer) and first.record.files_sha256
    assert _facts(first) == _facts(load_tokenizer(str(rewritten)))
    assert [p.suffix for p in (cache / RECORDS_DIR).iterdir()] == [".json"]
    assert read_record(cache, rewritten) is not None
    script = (
        "import sys; from pathlib import Path; from packcli.tokenize.encoders.tokenizer import open_tokenizer; "
        f"t = open_tokenizer({str(rewritten)!r}, Path({str(cache)!r})); "
        "assert 'transformers' not in sys.modules; print(type(t).__name__)"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "RecordedTokenizer", run.stderr
    assert _facts(open_tokenizer(str(rewritten), cache)) == _facts(first)


def test_without_a_cache_directory_the_tokenizer_is_served_from_a_record_of_this_run(
    rewritten: Path, llama3_tokenizer_dir: Path, tmp_path: Path
) -> None:
    # transformers' tokenizer is let go and its backend kept (no second parse of tokenizer.json), nothing written.
    loaded = load_tokenizer(str(rewritten))
    served = open_tokenizer(str(rewritten), None)
    assert isinstance(served, RecordedTokenizer) and served.record.files_sha256 == ""
    assert "backend_tokenizer" in served.__dict__  # opened once, by transformers
    assert _facts(served) == _facts(loaded)
    assert served.record.sha256 == record_of(loaded, rewritten).sha256  # type: ignore[union-attr]
    # A tokenizer transformers does not change: its record's backend is the JSON its backend writes.
    plain = open_tokenizer(str(llama3_tokenizer_dir), None)
    assert isinstance(plain, RecordedTokenizer) and plain.record.backend is not None
    assert _facts(plain) == _facts(load_tokenizer(str(llama3_tokenizer_dir)))


def test_a_changed_tokenizer_file_or_a_damaged_record_is_not_used(rewritten: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tok"
    shutil.copytree(rewritten, copy)
    cache = tmp_path / "cache"
    open_tokenizer(str(copy), cache)
    (record,) = (cache / RECORDS_DIR).iterdir()
    record.write_text("{not json")
    assert read_record(cache, copy) is None
    open_tokenizer(str(copy), cache)  # recorded again
    assert read_record(cache, copy) is not None
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["model_max_length"] = 77
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert read_record(cache, copy) is None  # another file: another key


def test_packs_with_a_recorded_tokenizer_give_the_same_shards_and_identity(
    rewritten: Path, tmp_path: Path, pack: Any
) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in make_conversations(30, seed=4)])
    outs = []
    for k, cache in enumerate(("--no-cache", "--cache-dir", "--cache-dir")):
        out = tmp_path / f"out{k}"
        extra = [cache, str(tmp_path / "cache")] if cache == "--cache-dir" else [cache]
        # The second and third runs use the same cache: the first of them records, the second reads the record
        # (a tokenizer-keyed cache miss both times: --seed changes no key, the entry is the same; cleared here).
        pack(data, "-o", out, "--tokenizer", rewritten, "--max-len", "256", "-q", *extra)
        for entry in (tmp_path / "cache").glob("*"):
            if entry.is_dir() and entry.name != RECORDS_DIR:
                shutil.rmtree(entry)
        outs.append(out)
    shards = [{p.name: p.read_bytes() for p in out.glob("shard-*")} for out in outs]
    assert shards[0] and shards[0] == shards[1] == shards[2]
    identities = [json.loads((out / "manifest.json").read_text())["tokenizer"] for out in outs]
    assert identities[0] == identities[1] == identities[2]


def test_a_run_the_fast_encoder_serves_never_opens_the_tokenizers_backend(tmp_path: Path) -> None:
    """Both at once hold a vocabulary twice (Gemma 3: 280 and 245 MB): the backend is opened only where used."""
    from packcli.tokenize.batches.ingest import worker_context
    from packcli.tokenize.encoders import encoder_choice
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder
    from packcli.tokenize.options import TokenizeOptions

    cache, big = tmp_path / "cache", encoder_choice.Work(10**9, 2)
    encoder_choice._loaded.cache_clear()
    first = Encoder(None, None, EncodeOptions(), records=cache, work=big)  # learns the facts: the probe opens it
    assert first.choice.encoder.name == "fastokens" and "backend" in first.__dict__
    encoder_choice._loaded.cache_clear()
    again = Encoder(None, None, EncodeOptions(), records=cache, work=big)
    assert again.choice.encoder.name == "fastokens"
    assert "backend" not in again.__dict__ and "backend_tokenizer" not in again.tokenizer.__dict__
    assert again.identity() == first.identity()
    small = Encoder(None, None, EncodeOptions(), records=cache, work=encoder_choice.Work(1000, 2))
    assert small.choice.encoder.name == "tokenizers"
    worker_context(TokenizeOptions(max_len=512), small)
    assert "backend" in small.__dict__  # opened before the workers fork, to be shared with them


def test_a_cache_that_knows_the_fast_encoder_lowers_the_size_it_pays_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Known facts: no probe, no second parse; the fast encoder pays from fewer bytes, whatever the workers."""
    from packcli.tokenize.encoders import encoder_choice
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

    monkeypatch.delenv(encoder_choice.ENCODER_ENV, raising=False)
    cache, unknown = tmp_path / "cache", tmp_path / "unknown"
    encoder_choice._loaded.cache_clear()  # built anew: the first Encoder below learns the facts by its probe
    Encoder(None, None, EncodeOptions(), records=cache, work=encoder_choice.Work(10**9, 2))  # learns the facts
    monkeypatch.setattr(encoder_choice, "FAST_MIN_BYTES", 10**6)  # 2 MB at two workers
    monkeypatch.setattr(encoder_choice, "FAST_MIN_BYTES_KNOWN", 10**5)
    middle = encoder_choice.Work(5 * 10**5, 2)  # under the first, over the second
    assert Encoder(None, None, EncodeOptions(), records=cache, work=middle).choice.encoder.name == "fastokens"
    first = Encoder(None, None, EncodeOptions(), records=unknown, work=middle).choice
    assert first.encoder.name == "tokenizers"
    assert first.fallback is not None and "(0.5 MB, under 2 MB)" in first.fallback
    below = Encoder(None, None, EncodeOptions(), records=cache, work=encoder_choice.Work(5 * 10**4, 2)).choice
    assert below.encoder.name == "tokenizers" and below.fallback is not None and "under 2 MB" in below.fallback


def test_an_encoder_from_its_record_holds_no_copy_of_the_tokenizers_json(tmp_path: Path) -> None:
    """48 MB for Gemma 3's: read again from the record if asked for, never held by the workers."""
    from packcli.tokenize.encoders import encoder_choice
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

    cache, big = tmp_path / "cache", encoder_choice.Work(10**9, 2)
    Encoder(None, None, EncodeOptions(), records=cache, work=big)  # makes the record
    again = Encoder(None, None, EncodeOptions(), records=cache, work=big)
    assert again.record is not None and again.choice.encoder.name == "fastokens"
    assert "backend_json" not in again.__dict__
    assert json.loads(again.backend_json)["model"]["type"] == "BPE"  # there when asked for


def test_the_backend_a_probe_opened_is_let_go_before_the_workers_fork(tmp_path: Path) -> None:
    """A run the fast encoder serves whole: its workers do not inherit the backend (40 MB less at one worker on
    DeepSeek's); one that needs it for a record the fast encoder cannot vouch for opens it again."""
    from packcli.tokenize.batches.ingest import worker_context
    from packcli.tokenize.encoders import encoder_choice
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder
    from packcli.tokenize.options import TokenizeOptions

    encoder_choice._loaded.cache_clear()
    probed = Encoder(None, None, EncodeOptions(), records=tmp_path / "cache", work=encoder_choice.Work(10**9, 2))
    assert probed.choice.encoder.name == "fastokens" and "backend" in probed.__dict__  # the probe opened it
    worker_context(TokenizeOptions(max_len=512), probed)
    assert "backend" not in probed.__dict__ and "backend_tokenizer" not in probed.tokenizer.__dict__
    texts = ["Hello, world!", "  two  spaces\tand é 中文 😀"]
    reference = probed.choice.encoder.reference  # type: ignore[attr-defined]
    assert [list(a) for a in _split(*reference.encode_flat(texts, False))] == [
        list(a) for a in _split(*probed.text.encode_flat(texts, False))
    ]
    assert "backend" in probed.__dict__  # opened again, from the record


def _split(ids: Any, starts: Any) -> list[Any]:
    return [ids[starts[k] : starts[k + 1]] for k in range(len(starts) - 1)]


def test_a_second_cache_directory_in_the_same_process_learns_the_fast_encoders_facts(tmp_path: Path) -> None:
    """The library packing twice in one process, with two caches: the encoder is loaded once, and both caches
    keep what was learned of it (the next process with either builds it without a probe)."""
    from packcli.tokenize.encoders import encoder_choice
    from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

    encoder_choice._loaded.cache_clear()
    big = encoder_choice.Work(10**9, 2)
    first = Encoder(None, None, EncodeOptions(), records=tmp_path / "one", work=big)
    second = Encoder(None, None, EncodeOptions(), records=tmp_path / "two", work=big)
    assert first.choice.encoder.name == second.choice.encoder.name == "fastokens"
    assert encoder_choice._loaded.cache_info().misses == 1  # built once
    key = encoder_choice.facts_key(first.backend_json)
    one, two = (encoder_choice.read_facts(tmp_path / d, key) for d in ("one", "two"))
    assert one is not None and two is not None and (one.fast, one.adds_tokens) == (two.fast, two.adds_tokens)
    assert one.byte_lengths is not None and two.byte_lengths is not None
    assert (one.byte_lengths == two.byte_lengths).all()


HUB_NAME = "packcli-test/qwen3"
# Runs the command line, then says whether the run imported transformers.
_PACK_SAYING_IMPORTS = (
    "import json, sys; from packcli.cli import main\n"
    "try:\n    main(sys.argv[1:])\nexcept SystemExit as end:\n    assert not end.code, end.code\n"
    "print(json.dumps({'transformers': 'transformers' in sys.modules}))"
)


def _hub_cache(hub: Path, tokenizer_dir: str, commit: str) -> None:
    """A Hub repository in the Hugging Face cache ``hub``, as a first load at ``commit`` leaves it."""
    repo = hub / f"models--{HUB_NAME.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(tokenizer_dir, snapshot)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def _hub_pack(
    tmp_path: Path, env: dict[str, str], out: str, *extra: str, ok: bool = True
) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """``pack`` with the Hub tokenizer in a process of its own: its summary and what it imported (or its
    error, where ``ok`` is False)."""
    data = tmp_path / "chat.jsonl"
    if not data.exists():
        write_jsonl(data, [{"messages": m} for m in make_conversations(20, seed=5)])
    argv = ["pack", str(data), "--max-len", "512", "--tokenizer", HUB_NAME, "-o", str(tmp_path / out), "--json", "-q"]
    done = subprocess.run(
        [sys.executable, "-c", _PACK_SAYING_IMPORTS, *argv, *extra],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert (done.returncode == 0) == ok, done.stderr
    if not ok:
        return done.stderr
    *summary, imports = done.stdout.strip().splitlines()
    return json.loads("\n".join(summary)), json.loads(imports)


def test_offline_a_hub_tokenizer_is_served_from_its_record_and_a_hit_loads_no_tokenizer(
    own_tokenizer: Callable[[str], tuple[str, Any]], tmp_path: Path
) -> None:
    _hub_cache(tmp_path / "hub", own_tokenizer("qwen3")[0], "1" * 40)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    cache = tmp_path / "cache"

    def run(out: str, *extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
        done = _hub_pack(tmp_path, env, out, *extra)
        assert not isinstance(done, str)
        return done

    first, loaded = run("first", "--cache-dir", str(cache))
    assert first["cache"] == "miss" and loaded["transformers"]
    assert [p.suffix for p in (cache / RECORDS_DIR).iterdir()] == [".json"]  # recorded, by the repository's name
    again, loaded = run("again", "--cache-dir", str(cache))
    assert again["cache"] == "hit" and not loaded["transformers"]  # keyed from the record: nothing loaded
    _, loaded = run("bare", "--no-cache")
    assert loaded["transformers"]  # no record to read: loaded, and served from a record of its own
    shards = [{p.name: p.read_bytes() for p in (tmp_path / o).glob("shard-*")} for o in ("first", "again", "bare")]
    assert shards[0] and shards[0] == shards[1] == shards[2]
    manifests = [json.loads((tmp_path / o / "manifest.json").read_text())["tokenizer"] for o in ("first", "bare")]
    assert manifests[0] == manifests[1] and manifests[0]["name"] == HUB_NAME
    # The key the record gives is the one the tokenizer transformers loads gives (as it was keyed before).
    check = (
        "import hashlib, sys; from pathlib import Path\n"
        "from transformers import AutoTokenizer\n"
        "from packcli.tokenize.encoders.tokenizer import plain_backend, recorded_key, tokenizer_sha256\n"
        f"t = AutoTokenizer.from_pretrained({HUB_NAME!r})\n"
        "loaded = tokenizer_sha256(plain_backend(t.backend_tokenizer)[0].to_str(), t.special_tokens_map)\n"
        "loaded += hashlib.sha256(t.chat_template.encode()).hexdigest()\n"
        f"assert recorded_key({HUB_NAME!r}, None, Path(sys.argv[1])) == loaded\n"
        "assert recorded_key('packcli-test/other', None, Path(sys.argv[1])) is None\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, str(cache)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr


class _Hub(http.server.ThreadingHTTPServer):
    """A Hub that knows one repository's current commit (``commit``) and serves no file: what is asked of it."""

    commit = ""
    asked: list[str]


class _HubAnswers(http.server.BaseHTTPRequestHandler):
    server: _Hub

    def _answer(self, body: bool) -> None:
        self.server.asked.append(f"{self.command} {self.path}")
        info = json.dumps({"id": HUB_NAME, "sha": self.server.commit}).encode()
        known = self.path == f"/api/models/{HUB_NAME}" or self.path.startswith(f"/api/models/{HUB_NAME}/revision/")
        self.send_response(200 if known else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(info) if known else 0))
        self.end_headers()
        if known and body:
            self.wfile.write(info)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)

    def log_message(self, *args: Any) -> None:
        pass


def test_online_a_hub_tokenizer_is_served_from_the_record_of_the_commit_the_hub_names(
    own_tokenizer: Callable[[str], tuple[str, Any]], tmp_path: Path
) -> None:
    # The Hub asked which commit the main revision is, as transformers asks it: a record of that commit's
    # snapshot serves; a new commit is loaded by transformers, never served from the old one's record.
    old = "2" * 40
    _hub_cache(tmp_path / "hub", own_tokenizer("qwen3")[0], old)
    hub = _Hub(("127.0.0.1", 0), _HubAnswers)
    hub.commit, hub.asked = old, []
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{hub.server_address[1]}"
        env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint}
        cache = ["--cache-dir", str(tmp_path / "cache")]
        first = _hub_pack(tmp_path, env, "first", *cache)
        assert not isinstance(first, str) and first[0]["cache"] == "miss" and first[1]["transformers"]
        hub.asked.clear()
        again = _hub_pack(tmp_path, env, "again", *cache, "--overwrite")
        assert not isinstance(again, str) and again[0]["cache"] == "hit" and not again[1]["transformers"]
        assert f"GET /api/models/{HUB_NAME}" in hub.asked  # the commit asked of the Hub
        shards = [{p.name: p.read_bytes() for p in (tmp_path / o).glob("shard-*")} for o in ("first", "again")]
        assert shards[0] and shards[0] == shards[1]
        hub.commit = "3" * 40  # a new commit, which this Hub cannot serve: transformers tries, and says so
        said = _hub_pack(tmp_path, env, "new", *cache, ok=False)
        assert isinstance(said, str) and f"cannot load tokenizer '{HUB_NAME}'" in said
    finally:
        hub.shutdown()
        hub.server_close()
