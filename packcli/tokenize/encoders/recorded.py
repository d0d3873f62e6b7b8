"""A tokenizer as transformers resolves it, recorded once and opened again with ``tokenizers`` alone.

Loading a tokenizer through transformers costs its import (over a second) and its class's own work:
some classes change the ``tokenizer.json`` they load (GPT2Tokenizer replaces its pre-tokenizer,
Qwen2Tokenizer its decoder, GemmaTokenizer the flags of added tokens), and every class derives the
special tokens, the chat template and the added tokens from several files by rules of its own. What a
run uses of all that is small: the backend as transformers left it, and a few facts. A record
(``TokenizerRecord``) keeps them, made from the tokenizer transformers loaded, so that it is what
transformers gives by construction; ``RecordedTokenizer`` serves them with the backend opened by
``tokenizers`` (from ``tokenizer.json`` when transformers left it as it is, else from the record).

Records are kept in the cache directory (``tokenizers/KEY.json``), keyed by the tokenizer's files
and the transformers version that resolved them; the default tokenizer's record ships with packcli
(``default_tokenizer.json``), so that a first run on a new machine imports no transformers either.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.resources
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packcli.contract import vocab_sha256
from packcli.jsontypes import JSONObject
from packcli.owned import write_whole
from packcli.tokenize.long.bounds import max_token_bytes

RECORD_FORMAT = 3
RECORDS_DIR = "tokenizers"
DEFAULT_RECORD = "default_tokenizer.json"
# The files of a tokenizer directory that transformers may read (what a record's key hashes).
_KEYED_SUFFIXES = (".json", ".jinja", ".model", ".txt", ".tiktoken")


def transformers_version() -> str:
    """The installed transformers' version, read from its metadata (no import)."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def files_sha256(directory: Path, hub: str | None = None) -> str:
    """A hash of the files of a tokenizer directory that transformers may read, names and bytes; and of
    the Hub name ``hub`` for a snapshot of a Hub repository in the Hugging Face cache (transformers may
    choose a tokenizer's class by the repository's name)."""
    h = hashlib.sha256()
    if hub is not None:
        h.update(b"hub\0" + hub.encode() + b"\0")
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.suffix in _KEYED_SUFFIXES:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    templates = directory / "additional_chat_templates"
    if templates.is_dir():
        for path in sorted(templates.iterdir()):
            if path.is_file():
                h.update(b"additional\0" + path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class TokenizerRecord:
    """What a run uses of a tokenizer transformers loaded (see the module's docstring)."""

    files_sha256: str
    transformers: str
    class_name: str
    backend: str | None  # the backend's JSON where transformers changed tokenizer.json; None: the file as it is
    special_tokens_map: dict[str, Any]
    added_tokens: list[tuple[int, str]]  # added_tokens_decoder: (id, content)
    all_special_tokens: list[str]
    all_special_ids: list[int]
    named: dict[str, tuple[str | None, int | None]]  # bos, eos, pad, unk: (token, id)
    vocab_size: int  # len(tokenizer): the vocabulary with its added tokens
    vocab_sha256: str
    chat_template: str | dict[str, str] | None
    # Derived from the backend once, not asked of transformers: the most bytes a token covers
    # (``tokenize.long.bounds``), the settings apply_chat_template turns off (``plain_backend``) and the
    # identity the manifest gives it.
    max_token_bytes: int | None = None
    overridden: tuple[str, ...] = ()
    sha256: str = ""
    format: int = RECORD_FORMAT

    def key(self) -> str:
        return record_key(self.files_sha256, self.transformers)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TokenizerRecord | None:
        """The record in ``text``; None for one of another format, or damaged."""
        try:
            data = json.loads(text)
            if data.get("format") != RECORD_FORMAT:
                return None
            data["added_tokens"] = [(int(i), str(c)) for i, c in data["added_tokens"]]
            data["named"] = {k: (v[0], v[1]) for k, v in data["named"].items()}
            data["overridden"] = tuple(data["overridden"])
            return cls(**data)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def record_key(files: str, transformers: str) -> str:
    return hashlib.sha256(f"{files}\0{transformers}\0{RECORD_FORMAT}".encode()).hexdigest()[:32]


def record_of(tokenizer: Any, directory: Path, kept: bool = True, hub: str | None = None) -> TokenizerRecord | None:
    """Record a tokenizer transformers loaded from ``directory``; None where a fact is not plain data
    (a special token that is no string), which a record cannot keep.

    ``kept`` False: the record serves this run only (no cache directory to keep it in), so it is neither
    keyed by the directory's files nor checked against ``tokenizer.json`` (which would open the file again:
    1.3 s for Gemma 3's): its backend is the JSON transformers' backend writes, what a run without a
    record built the fast encoder from. ``hub``: the Hub name transformers loaded it by, ``directory``
    being that repository's snapshot in the Hugging Face cache.
    """
    special = dict(tokenizer.special_tokens_map)
    if not all(
        isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)) for v in special.values()
    ):
        return None
    template = tokenizer.chat_template
    if not (template is None or isinstance(template, str) or _named_templates(template)):
        return None
    from tokenizers import Tokenizer

    backend = tokenizer.backend_tokenizer.to_str()
    as_file = directory / "tokenizer.json"
    unchanged = kept and as_file.is_file() and Tokenizer.from_file(str(as_file)).to_str() == backend
    plain, overridden = plain_backend(tokenizer.backend_tokenizer)
    return TokenizerRecord(
        files_sha256=files_sha256(directory, hub) if kept else "",
        transformers=transformers_version(),
        class_name=type(tokenizer).__name__,
        backend=None if unchanged else backend,
        special_tokens_map=special,
        added_tokens=[(int(i), str(t.content)) for i, t in sorted(tokenizer.added_tokens_decoder.items())],
        all_special_tokens=[str(t) for t in tokenizer.all_special_tokens],
        all_special_ids=[int(i) for i in tokenizer.all_special_ids],
        named={
            name: (getattr(tokenizer, f"{name}_token"), getattr(tokenizer, f"{name}_token_id"))
            for name in ("bos", "eos", "pad", "unk")
        },
        vocab_size=len(tokenizer),
        vocab_sha256=vocab_sha256(tokenizer.get_vocab()),
        chat_template=template,
        max_token_bytes=max_token_bytes(backend),
        overridden=overridden,
        sha256=tokenizer_sha256(plain.to_str() if overridden else backend, special),
    )


def _named_templates(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def read_record(directory: Path | None, tokenizer_dir: Path, hub: str | None = None) -> TokenizerRecord | None:
    """The record of the tokenizer in ``tokenizer_dir`` (the snapshot of the Hub repository ``hub``) kept
    in ``directory``, if any."""
    files = files_sha256(tokenizer_dir, hub)
    key = record_key(files, transformers_version())
    candidates = [directory / RECORDS_DIR / f"{key}.json"] if directory is not None else []
    for path in candidates:
        with contextlib.suppress(OSError):
            record = TokenizerRecord.from_json(path.read_text(encoding="utf-8"))
            if record is not None and record.files_sha256 == files:
                return record
    return None


def shipped_record(tokenizer_dir: Path) -> TokenizerRecord | None:
    """The record packcli ships for its default tokenizer, when ``tokenizer_dir`` holds exactly its files.

    Made with transformers (``tests/test_recorded.py`` holds it equal to what the installed transformers
    gives); its files' hash is checked, so a changed default tokenizer package is loaded anew.
    """
    text = (
        importlib.resources.files("packcli").joinpath(f"tokenize/encoders/{DEFAULT_RECORD}").read_text(encoding="utf-8")
    )
    record = TokenizerRecord.from_json(text)
    if record is None or record.files_sha256 != files_sha256(tokenizer_dir):
        return None
    return record


def write_record(directory: Path, record: TokenizerRecord) -> None:
    """Keep ``record`` in ``directory``'s records, written whole or not at all; a directory that cannot
    take it (read-only, full) is left as it is: the next run resolves the tokenizer again."""
    where = directory / RECORDS_DIR
    with contextlib.suppress(OSError):
        where.mkdir(parents=True, exist_ok=True)
        write_whole(where / f"{record.key()}.json", lambda fh: fh.write(record.to_json().encode("utf-8")))


class RecordedTokenizer:
    """The parts of a transformers fast tokenizer a run uses, from a record and the backend ``tokenizers`` opens."""

    is_fast = True

    def __init__(self, record: TokenizerRecord, tokenizer_dir: Path, backend: Any = None) -> None:
        """``backend``: the record's backend, opened already (transformers' own, where it was just recorded)."""
        self.record = record
        if backend is not None:
            self.backend_tokenizer = backend
        self.name_or_path = str(tokenizer_dir)
        self.special_tokens_map = dict(record.special_tokens_map)
        self.chat_template = record.chat_template
        self.all_special_tokens = list(record.all_special_tokens)
        self.all_special_ids = list(record.all_special_ids)
        self.vocab_sha256 = record.vocab_sha256
        for name, (token, token_id) in record.named.items():
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", token_id)

    @functools.cached_property
    def backend_tokenizer(self) -> Any:
        """The ``tokenizers`` backend, opened when first asked for: a run the fast encoder serves whole never asks
        (the two together hold a large vocabulary twice: 280 and 245 MB for Gemma 3's 262k tokens)."""
        from tokenizers import Tokenizer

        if self.record.backend is None:
            return Tokenizer.from_file(str(Path(self.name_or_path) / "tokenizer.json"))
        return Tokenizer.from_str(self.record.backend)

    def backend_text(self) -> str:
        """The backend as JSON text, without opening it: ``tokenizer.json`` as it is, or the record's."""
        if self.record.backend is None:
            return (Path(self.name_or_path) / "tokenizer.json").read_text(encoding="utf-8")
        return self.record.backend

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        from tokenizers import AddedToken

        return {
            i: AddedToken(content, special=content in self.all_special_tokens)
            for i, content in self.record.added_tokens
        }

    def __len__(self) -> int:
        return self.record.vocab_size

    def get_vocab(self) -> dict[str, int]:  # the backend's, as a fast tokenizer's
        vocab: dict[str, int] = self.backend_tokenizer.get_vocab(with_added_tokens=True)
        return vocab

    def convert_tokens_to_ids(self, token: str) -> int | None:
        found: int | None = self.backend_tokenizer.token_to_id(token)
        return getattr(self, "unk_token_id", None) if found is None else found

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` (as a fast tokenizer's ``encode`` gives them)."""
        ids: list[int] = self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: Any, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        """The text of ``ids`` (any sequence of ints), as a fast tokenizer decodes them without cleaning up spaces."""
        if clean_up_tokenization_spaces:
            raise ValueError("a recorded tokenizer decodes without cleaning up spaces")
        text: str = self.backend_tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        return text


def plain_backend(backend: Any) -> tuple[Any, tuple[str, ...]]:
    """Return the backend tokenizer with truncation and padding off, and which of them were on.

    ``apply_chat_template`` turns both off for its own call, whatever ``tokenizer.json`` says; packcli
    encodes with the backend, so it turns them off on a copy (the loaded tokenizer stays as it was).
    """
    overrides = tuple(
        name for name, on in (("truncation", backend.truncation), ("padding", backend.padding)) if on is not None
    )
    if not overrides:
        return backend, ()
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(backend.to_str())
    plain.no_truncation()
    plain.no_padding()
    return plain, overrides


def tokenizer_sha256(backend_json: str, special_tokens_map: JSONObject) -> str:
    """Return the tokenizer's own identity: a hash of its backend (``tokenizer.json`` text) and special tokens.

    Not of a run's template keyword arguments (the manifest's chat_template_kwargs and the cache key's
    options hold those), so that one tokenizer has one sha256 whatever --template-kwarg a run passes.
    """
    h = hashlib.sha256(backend_json.encode())
    h.update(json.dumps(dict(special_tokens_map), sort_keys=True, default=str).encode())
    return h.hexdigest()
