"""The run's token store made whole (no cache parts: ``--limit``, ``--processor``, a dry run, the cache off,
or an engine that makes no parts), its inputs read once.

A local file the memo does not know (JSON lines, JSON, CSV, Parquet, Arrow) is hashed as it is tokenized,
not before: the entry's key is then known once the inputs are read, and the store goes there (or, when
another run made that entry in the meantime, or it is a copy of a cached input, the entry found is used and
the store just made let go). With ``--limit``, the rest of a file cut by the limit, and the files after it,
are read for their
hashes alone. The memo learns what the read learned, so a rerun finds the entry by the files' stamps.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packcli.config import PackConfig
from packcli.contract import Progress
from packcli.engines import Engine, WholeStore
from packcli.errors import InputError, Message
from packcli.io.fingerprint import Learned
from packcli.jsontypes import JSONObject
from packcli.procs.stop import raise_if_stopped
from packcli.run.encoder import Tokenizing, run_encoder
from packcli.run.inputs import Inputs, changed
from packcli.run.options import tokenize_options
from packcli.store.cachedir import touch
from packcli.store.tokens import TokenStore

if TYPE_CHECKING:
    from packcli.tokenize.encoders.encoder import Encoder

# Looks up the run's entry by its key: the store found (locked while in use), the cache state, warnings.
LookUp = Callable[[str], tuple[TokenStore | None, str, list[Message]]]


@dataclass
class WholeRun:
    """What making one whole store needs of the run (``whole_store``)."""

    config: PackConfig
    inputs: Inputs  # the run's inputs, identified (their hashes None where taken as they are read)
    engine: Engine
    progress: Progress
    rule_out_long: bool
    options: JSONObject  # the key's options
    warnings: list[Message]  # the run's, which the entry's lookup adds to
    tokenizing: Tokenizing  # what the run tokenizes with (``run.encoder.name_tokenizer``)


class _Found(Exception):
    """The run's entry, found under the key known once the inputs were read: used instead of the store made."""

    def __init__(self, store: TokenStore, state: str) -> None:
        super().__init__()
        self.store, self.state = store, state


def whole_store(
    run: WholeRun,
    looked_up: tuple[str | None, str],
    look_up: LookUp,
    encoder: Encoder | None,
    entry: bool,
    scratch: Path | None,
    stack: contextlib.ExitStack,
) -> tuple[TokenStore, str, str | None]:
    """Tokenize every input into one store; return it, the cache state and the entry's key.

    ``looked_up``: the entry's key (None while an input's hash is taken as it is read) and the state its
    lookup gave. ``entry``: the store is the cache entry (else scratch space under ``scratch``, removed with
    ``stack``). A key known only once the inputs are read is looked up then (``look_up``).
    """
    key, state = looked_up
    config = run.config
    if encoder is None:
        encoder = run_encoder(config, run.tokenizing, run.inputs.sources)
    run.inputs.settle()  # the hashes taken beside the tokenizer's loading: before a worker is forked
    if entry:
        # Its key known, or known once read: the store is begun beside the entries (its name then given).
        store_path = run.inputs.cache_root / (key if key is not None else "pending")
    else:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=".packcli-tokens-", dir=scratch))
        store_path = Path(tmp) / "tokens"
    raise_if_stopped()

    def read_through(read: dict[str, str]) -> Path | None:
        nonlocal key, state
        moved = run.inputs.changed_while_read(run.engine, read)
        if moved is not None:
            raise InputError(changed(moved))
        if key is not None or not config.cache:
            return None
        key = run.inputs.entry_key(run.options)
        assert key is not None
        found, state, said = look_up(key)
        if found is not None:
            raise _Found(found, state)
        run.warnings.extend(said)  # a damaged entry under it, made again
        return run.inputs.cache_root / key if entry else None

    job = WholeStore(
        options=tokenize_options(config), formats=run.inputs.formats, encoder=encoder, progress=run.progress,
        rule_out_long=run.rule_out_long, sources=run.inputs.sources, path=store_path, before_finish=read_through,
    )  # fmt: skip
    learning = [f is None for f in run.inputs.fingerprints]
    try:
        store = run.engine.tokenize(job)
    except _Found as found:
        if entry:
            touch(found.store.path)  # its last use, for pruning by age
        return found.store, found.state, key
    if not entry:
        stack.callback(store.discard_elsewhere)  # a scratch store's tokens kept outside its directory
    elif any(learning):
        run.inputs.memo.remember_reads(_learned(run, store, learning), run.inputs.fields_key)  # saved by the run
    return store, state, key


def _learned(run: WholeRun, store: TokenStore, learning: list[bool]) -> list[Learned]:
    """What the read learned of the inputs hashed as they were read, for the memo: their hashes, and their
    records when every one was read (not those of an input ``--limit`` may have cut)."""
    starts = [*store.meta.source_starts, store.meta.records_read]
    learned = []
    for k, source in enumerate(run.inputs.sources):
        digest, stamp = run.inputs.fingerprints[k], run.inputs.before.get(str(Path(source.path)))
        if learning[k] and digest is not None and stamp is not None:
            # Its records, unless --limit may have cut it (it ended before the limit was reached: whole).
            whole = run.config.limit is None or starts[k + 1] < run.config.limit
            records = starts[k + 1] - starts[k] if whole else None
            learned.append(Learned(source, (digest, records, stamp), run.inputs.formats[source.display]))
    return learned
