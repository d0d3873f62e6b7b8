"""Reading packed output for training: the checks before the first step, the rows in order (Parquet or
Arrow), and a sampler that keeps ``--world-size`` balancing.

:func:`check_compatible` reads the output's manifest and refuses, in one line each, what would train
wrong or crash: a recipe of another task (SFT on preference pairs trains the rejected answers), a model
whose input embedding is smaller than the largest packed id, and a tokenizer other than the one the
output was packed with (its vocabulary size, special tokens or vocabulary differ). ``load_rows``,
``PackedCollator`` and ``PreferenceCollator`` run it when given the output, the model or the tokenizer.

``packcli pack --world-size N`` writes rows in steps of N: rank ``r`` is meant to read the ``r``-th row
of every step, and the rows of a step have about the same number of tokens, so that no rank waits for
another. A shuffling sampler (``DataLoader(shuffle=True)``, the Trainer's default ``RandomSampler``)
mixes rows of all steps and undoes that. :class:`RankStepSampler` shuffles whole steps instead (per
epoch, seeded), so each rank still reads one row of each step, in a new step order every epoch.

Needs torch for the sampler (``pip install "packcli[torch]"``); :func:`load_rows` needs only datasets,
:func:`check_compatible` neither (a tokenizer given by name is loaded with transformers).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packcli.contract import (
    DEFAULT_TOKENIZER,
    MANIFEST,
    PREFIX_TREES,
    default_tokenizer_dir,
    hub_reachable,
    missing_tokenizer,
    vocab_sha256,
)
from packcli.errors import IncompatibleError, Opt, OutputError, UsageError, first_line
from packcli.jsontypes import JSONObject

TASKS = ("sft", "preference", "kto")
# What each task's output holds, and how to train it.
_HOLDS = {
    "sft": "an SFT output (task sft)",
    "preference": "a preference output (task preference: each record's chosen and rejected answers)",
    "kto": "a KTO output (task kto: answers labelled desirable or undesirable)",
}
_TRAIN_WITH = {
    "sft": "train it with packcli.train.collate.PackedCollator (examples/train_torch_loop.py)",
    "preference": "train it with packcli.train.dpo.PreferenceCollator and dpo_loss (examples/train_dpo.py)",
    "kto": "train it with packcli.train.dpo.PreferenceCollator and kto_loss",
}
# The special token whose value may differ: a trainer often sets it (pad = eos), and the padding's id is
# never trained on (docs/training.md, "The padding rule").
_FREE_ROLES = ("pad_token",)


def read_output_manifest(directory: str | Path) -> JSONObject:
    """Return the manifest of a ``packcli pack`` output; OutputError (one line) when there is none to read."""
    root = Path(directory)
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or not isinstance(manifest["shards"], list):
            raise ValueError("not a packcli manifest")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise OutputError(f"{root}: no readable {MANIFEST} ({exc}); pass a packcli pack output directory") from exc
    return manifest


def load_rows(
    directory: str | Path,
    cache_dir: str | None = None,
    *,
    task: str | Collection[str] | None = None,
    model: Any = None,
    tokenizer: Any = None,
    trees: bool = False,
) -> Any:
    """Return the rows of a ``packcli pack`` output as a ``datasets.Dataset``, in the written order.

    Reads the shards the manifest lists, whatever ``--output-format`` wrote them (Parquet; Arrow,
    memory-mapped as it is; MDS and Megatron, read back as packcli rows in memory); ``cache_dir`` is
    where datasets converts Parquet. Given ``task``, ``model`` or ``tokenizer``, it first runs
    :func:`check_compatible` with them. An output of prefix trees is refused unless ``trees`` says that
    the rows go to a consumer that builds their attention mask (``PackedCollator("padded")``).
    """
    root = Path(directory)
    manifest = read_output_manifest(root)
    if task is not None or model is not None or tokenizer is not None:
        check_compatible(root, task=task, model=model, tokenizer=tokenizer, manifest=manifest, trees=trees)
    else:
        _check_trees(root, manifest, trees)
    from datasets import Dataset, concatenate_datasets  # after the checks: a refusal needs no datasets (0.8 s)

    try:
        files = [root / entry["file"] for entry in manifest["shards"]]
    except (KeyError, TypeError) as exc:
        raise OutputError(f"{root}: no readable {MANIFEST} ({exc}); pass a packcli pack output directory") from exc
    if not files:
        raise OutputError(f"{root}: the output holds no shard (a dry run?); pack it again")
    from packcli.output.formats import format_of, read_shard

    reader = format_of(files[0]).datasets_reader
    if reader is None:
        # Read back as packcli rows (in memory): these layouts (MDS, Megatron's) are not datasets' own.
        import pyarrow as pa
        from datasets.table import InMemoryTable

        return Dataset(InMemoryTable(pa.concat_tables([read_shard(f) for f in files])))
    parts = [
        Dataset.from_parquet(str(f), cache_dir=cache_dir) if reader == "parquet" else Dataset.from_file(str(f))
        for f in files
    ]
    return concatenate_datasets(parts) if len(parts) > 1 else parts[0]


# -- checks before the first step ------------------------------------------------------------------


@dataclass(frozen=True)
class Compatibility:
    """What :func:`check_compatible` found. ``unchecked`` names, one line each, what an older manifest
    did not record and so was not checked (empty for an output of this version)."""

    output: str
    task: str
    max_token_id: int | None  # None: an older manifest does not record it and no model asked for it
    vocab_size: int | None
    embedding_size: int | None
    unchecked: tuple[str, ...] = ()


def check_compatible(
    output: str | Path,
    *,
    task: str | Collection[str] | None = None,
    model: Any = None,
    tokenizer: Any = None,
    manifest: JSONObject | None = None,
    trees: bool = False,
) -> Compatibility:
    """Check, before the first step, that a packed output fits the recipe, the model and the tokenizer.

    - ``task``: what the recipe trains, ``"sft"``, ``"preference"`` or ``"kto"`` (or several it accepts);
      an output of another task is refused (SFT on a preference output would train the rejected answers).
    - ``model``: a model with ``get_input_embeddings()`` (transformers), a ``torch.nn.Embedding``, or the
      number of input embeddings; refused when the largest packed id (``max_token_id``) is not below it.
    - ``tokenizer``: the tokenizer the training uses (a transformers or ``tokenizers`` tokenizer, or a name
      or directory to load); refused when its vocabulary size, its special tokens (their ids, and which
      is bos, eos...: all but the pad token, which the padding never trains) or its vocabulary itself
      (``vocab_sha256``) differ from the ones the output was packed with.
    - ``trees``: whether the consumer builds the attention mask of prefix-tree rows (``PackedCollator``'s
      padded mode does); an output of prefix trees (manifest ``prefix_trees``) is refused otherwise, since
      a layout that reads only ``position_ids`` (or varlen kwargs) lets the branches attend to each other.

    Raises IncompatibleError (one line naming the output, what differs and what to do), OutputError
    when the output cannot be read; returns what was found. ``manifest`` is the output's manifest when
    read already. An older manifest without ``max_token_id`` has it computed from the shards (when a
    model is given); one without the tokenizer's fingerprint and special tokens has them listed in
    ``unchecked``.
    """
    root = Path(output)
    manifest = read_output_manifest(root) if manifest is None else manifest
    found = output_task(manifest)
    unchecked: list[str] = []
    if task is not None:
        _check_task(root, found, task)
    _check_trees(root, manifest, trees)
    max_id = manifest.get("max_token_id")
    max_id = max_id if isinstance(max_id, int) and not isinstance(max_id, bool) else None
    recorded: JSONObject = manifest["tokenizer"] if isinstance(manifest.get("tokenizer"), dict) else {}
    size = None
    if model is not None:
        size = embedding_size(model)
        max_id = _max_token_id(root, manifest) if max_id is None else max_id
        if max_id >= size:
            raise IncompatibleError(
                f"{root}: the shards hold token id {max_id}, but the model's input embedding has {size} rows; "
                f"the output was packed with tokenizer {_named(recorded)}: train a model of that tokenizer, "
                "or pack again with the model's tokenizer (the ",
                Opt("tokenizer"),
                " option)",
            )
    if tokenizer is not None:
        unchecked += _check_tokenizer(root, recorded, tokenizer)
    vocab = recorded.get("vocab_size")
    return Compatibility(str(root), found, max_id, vocab if isinstance(vocab, int) else None, size, tuple(unchecked))


def output_task(manifest: JSONObject) -> str:
    """Return the task of a packed output: its manifest's ``task``; an output written before tasks is SFT,
    unless its shards have roles (``sample_role``), then it is preference data."""
    task = manifest.get("task")
    if isinstance(task, str) and task in TASKS:
        return task
    columns = manifest.get("columns")
    return "preference" if isinstance(columns, list) and "sample_role" in columns else "sft"


def _check_task(root: Path, found: str, task: str | Collection[str]) -> None:
    wanted = (task,) if isinstance(task, str) else tuple(task)
    unknown = [t for t in wanted if t not in TASKS]
    if unknown or not wanted:
        raise UsageError(f"task must be one of {', '.join(TASKS)}, not {unknown[0] if unknown else 'nothing'!r}")
    if found in wanted:
        return
    if wanted == ("sft",):
        other = "rejected" if found == "preference" else "undesirable"
        raise IncompatibleError(
            f"{root}: {_HOLDS[found]}, but this SFT recipe would train its {other} answers too; {_TRAIN_WITH[found]}"
        )
    if "preference" in wanted and "kto" in wanted:
        needs, records = "preference or KTO samples", "preference or KTO records"
    elif "preference" in wanted:
        needs, records = "chosen and rejected pairs", "prompt/chosen/rejected records"
    else:
        needs, records = "KTO samples (desirable or undesirable)", "prompt/completion/label records"
    raise IncompatibleError(
        f"{root}: {_HOLDS[found]}, but this recipe needs {needs}; {_TRAIN_WITH[found]}, or pack {records} for it"
    )


def _check_trees(root: Path, manifest: JSONObject, trees: bool) -> None:
    if manifest.get(PREFIX_TREES) is True and not trees:
        raise IncompatibleError(
            f"{root}: the output holds prefix trees, whose branches would attend to each other without their "
            'attention mask; collate it with PackedCollator("padded") and pass trees=True'
        )


def _max_token_id(root: Path, manifest: JSONObject) -> int:
    """The largest id in the shards of an output written before its manifest recorded ``max_token_id``."""
    from packcli.output.formats import read_shard

    largest = -1
    for entry in manifest.get("shards", []):
        path = root / str(entry.get("file") if isinstance(entry, dict) else entry)
        try:
            ids = read_shard(path).column("input_ids").combine_chunks().flatten()
        except (OSError, ValueError, KeyError) as exc:
            raise OutputError(f"{path}: cannot be read ({exc}); check the output with packcli verify") from exc
        if len(ids):
            largest = max(largest, int(ids.to_numpy().max()))
    return largest


def embedding_size(model: Any) -> int:
    """Return the number of input embeddings of ``model``: a transformers model, an embedding, or an int."""
    if isinstance(model, (int, np.integer)) and not isinstance(model, bool):
        return int(model)
    embedding = model
    if hasattr(model, "get_input_embeddings"):
        try:
            embedding = model.get_input_embeddings()
        except NotImplementedError:
            embedding = None
    n = getattr(embedding, "num_embeddings", None)  # also under ZeRO-3, where the weight is partitioned
    if n is None:
        weight = getattr(embedding, "weight", None)
        n = weight.shape[0] if weight is not None and getattr(weight, "ndim", 0) == 2 else None
    if n is None:
        raise UsageError(
            f"cannot tell the input embedding size of {type(model).__name__}; pass model= that number (an int)"
        )
    return int(n)


def _named(recorded: JSONObject) -> str:
    size = recorded.get("vocab_size")
    return f"'{recorded.get('name', '?')}'" + (f" ({size} tokens)" if size is not None else "")


def _check_tokenizer(root: Path, recorded: JSONObject, tokenizer: Any) -> list[str]:
    """Refuse a tokenizer other than the recorded one; return what the manifest is too old to tell."""
    if isinstance(tokenizer, (str, Path)):
        from transformers import AutoTokenizer

        name = str(tokenizer)
        # The default tokenizer's name (what the summary and manifest show) is the installed package's copy:
        # never a Hub lookup, which offline retries for most of a minute.
        source = default_tokenizer_dir() if name == DEFAULT_TOKENIZER else name
        missing = missing_tokenizer(source)
        if missing is not None:  # a model's directory, say: transformers' own error names no file
            raise UsageError(
                f"cannot load tokenizer '{name}': {missing}",
                hint=(
                    "pass the directory or Hub name of the model's tokenizer, or the loaded tokenizer, as ",
                    Opt("tokenizer"),
                ),
            )
        # Without network, the local Hub cache only: transformers retries a Hub it cannot reach for most of a minute.
        offline = not os.path.exists(source) and not hub_reachable()
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        except Exception as exc:  # transformers raises OSError, ValueError, HTTP errors... for one failure
            raise UsageError(
                f"cannot load tokenizer '{name}': {first_line(exc)}; pass a tokenizer's name or directory"
            ) from exc
    if hasattr(tokenizer, "get_vocab_size"):  # a tokenizers.Tokenizer
        vocab = dict(tokenizer.get_vocab(with_added_tokens=True))
        size, roles = tokenizer.get_vocab_size(with_added_tokens=True), None
    else:
        vocab = dict(tokenizer.get_vocab())
        size = len(tokenizer)
        named = getattr(tokenizer, "special_tokens_map", None) or {}
        roles = {k: v for k, v in named.items() if isinstance(v, str)}
    packed_with = f"the output was packed with {_named(recorded)}"
    fix = ("pass that tokenizer, or pack again with this one (the ", Opt("tokenizer"), " option)")
    recorded_size = recorded.get("vocab_size")
    if isinstance(recorded_size, int) and size != recorded_size:
        raise IncompatibleError(f"{root}: the tokenizer has {size} tokens, but {packed_with}", hint=fix)
    recorded_roles, recorded_ids = recorded.get("special_tokens"), recorded.get("special_token_ids")
    if isinstance(recorded_roles, dict) and roles is not None:
        for role in sorted((set(recorded_roles) | set(roles)) - set(_FREE_ROLES)):
            if recorded_roles.get(role) != roles.get(role):
                raise IncompatibleError(
                    f"{root}: the tokenizer's {role} is {roles.get(role)!r}, but {packed_with}, "
                    f"whose {role} is {recorded_roles.get(role)!r}",
                    hint=fix,
                )
    if isinstance(recorded_ids, dict):
        for token, i in recorded_ids.items():
            if vocab.get(token) != i:
                where = "lacks it" if token not in vocab else f"gives it id {vocab[token]}"
                raise IncompatibleError(
                    f"{root}: special token {token!r} has id {i} in the output, but the tokenizer {where}",
                    hint=fix,
                )
    recorded_sha = recorded.get("vocab_sha256")
    if isinstance(recorded_sha, str) and vocab_sha256(vocab) != recorded_sha:
        raise IncompatibleError(
            f"{root}: the tokenizer's vocabulary differs from the one the output was packed with "
            f"({_named(recorded)}: the same size, other tokens or ids)",
            hint=fix,
        )
    if not isinstance(recorded_sha, str) or not isinstance(recorded_ids, dict):
        return [
            f"{root}: the manifest records no vocabulary fingerprint or special tokens (written before them): "
            "only the tokenizer's vocabulary size was checked; pack again to check the rest"
        ]
    return []


def step_order(
    rows: int, world_size: int, batch_size: int = 1, epoch: int = 0, seed: int = 0, shuffle: bool = True
) -> np.ndarray:
    """Return the row order of one epoch: whole steps (shuffled), dealt out as batches rank by rank.

    The order is for a loader that hands out batches round-robin over the ranks (accelerate's, hence
    the Trainer's): each run of ``world_size`` batches holds, for rank ``r``, the ``r``-th rows of the
    same ``batch_size`` steps. When the steps are not a multiple of ``batch_size``, the first steps
    of the epoch's order are repeated to fill the last batches. With ``world_size`` 1 it is a plain
    seeded shuffle of the rows (nothing repeated).
    """
    if world_size < 1 or batch_size < 1:
        raise UsageError(f"world_size and batch_size must be at least 1, not {world_size} and {batch_size}")
    if rows % world_size:
        raise UsageError(
            f"{rows} rows are not whole steps of {world_size}: pass the ",
            Opt("world_size"),
            " the output was packed with (its manifest says), or pack it again with this one",
        )
    steps = np.arange(rows // world_size, dtype=np.int64)
    if shuffle:
        steps = np.random.default_rng([seed, epoch]).permutation(steps)
    if world_size > 1 and len(steps) % batch_size:
        # A loader cuts the order into batches of batch_size rows: the last batches are filled with
        # steps from the start of this epoch's order (as DistributedSampler repeats rows to even out).
        steps = np.resize(steps, -(-len(steps) // batch_size) * batch_size)
    ranks = np.arange(world_size, dtype=np.int64)[:, None]
    chunks = [(steps[i : i + batch_size] * world_size)[None, :] + ranks for i in range(0, len(steps), batch_size)]
    # Each chunk is world_size x batch_size: rank 0's batch, then rank 1's, ...
    return np.concatenate([c.ravel() for c in chunks]) if chunks else np.zeros(0, np.int64)


def _sampler_base() -> type:
    try:
        from torch.utils.data import Sampler
    except ImportError:  # the sampler needs torch; load_rows and step_order do not
        return object
    return Sampler


class RankStepSampler(_sampler_base()):  # type: ignore[misc]
    """A torch Sampler over packed rows that shuffles whole ``--world-size`` steps, once per epoch.

    - ``rank=None`` (the Trainer, accelerate): yields every row, in an order whose batches, dealt
      round-robin to the ranks, give rank ``r`` the ``r``-th row of each step (see :func:`step_order`).
      ``batch_size`` must be the per-device batch size.
    - ``rank=r`` (your own loop under torchrun, instead of ``DistributedSampler``): yields rank ``r``'s
      rows only, one per step.

    Call ``set_epoch(epoch)`` at each epoch for a new step order (the Trainer does).
    """

    def __init__(
        self,
        rows: int | Any,
        world_size: int,
        batch_size: int = 1,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        self.rows = rows if isinstance(rows, int) else len(rows)
        if rank is not None and not 0 <= rank < world_size:
            raise UsageError(f"rank must be between 0 and {world_size - 1}, not {rank}")
        step_order(self.rows, world_size, batch_size)  # refuses what cannot be split
        self.world_size, self.batch_size, self.rank = world_size, batch_size, rank
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.rank is not None:  # one row per step for this rank: no batches to fill
            order = step_order(self.rows, self.world_size, 1, self.epoch, self.seed, self.shuffle)
            order = order[order % self.world_size == self.rank]
        else:
            order = step_order(self.rows, self.world_size, self.batch_size, self.epoch, self.seed, self.shuffle)
        return iter(order.tolist())

    def __len__(self) -> int:
        steps = self.rows // self.world_size
        if self.rank is not None or self.world_size == 1:
            return steps
        return -(-steps // self.batch_size) * self.batch_size * self.world_size
