"""The run's cache entry: its key (of the inputs' hashes, in order, and the key's options), its lookup
(a checked store, or why none is used), and what is said when an input changed while it was read."""

from __future__ import annotations

from pathlib import Path

from packcli.engines import DigestChecker, Engine, HashJob
from packcli.errors import Message
from packcli.io.fingerprint import files_to_hash, settled_unchanged
from packcli.io.sources import InputSource
from packcli.jsontypes import JSONObject
from packcli.store.integrity import DamagedStore
from packcli.store.key import cache_key
from packcli.store.tokens import TokenStore, find_store


def entry_key(
    sources: list[InputSource], formats: dict[str, str | None], fingerprints: list[str | None], options: JSONObject
) -> str | None:
    """The key of the run's cache entry, or None while the hash of an input is not known.

    Each input by its content, in order (sample_index follows it), with the reader its file type chose and
    the record format found: never its path, so that any spelling of a path, a copy, stdin or a preset
    run from elsewhere finds the same entry.
    """
    if any(f is None for f in fingerprints):
        return None
    entries = [[s.kind, s.compression, formats[s.display], f] for s, f in zip(sources, fingerprints, strict=True)]
    return cache_key({"inputs": entries, **options})


def all_known(fingerprints: list[str | None]) -> list[str]:
    """The inputs' hashes, every one known."""
    found = [f for f in fingerprints if f is not None]
    assert len(found) == len(fingerprints)
    return found


def rehashed(
    engine: Engine, sources: list[InputSource], before: dict[str, list[int]], stamped_ns: int
) -> dict[str, str]:
    """The inputs' hashes taken again, once read, by the engine where it reads them (none: the run hashes
    them itself, in ``changed_input``): of the inputs whose stamps changed or had not settled when taken
    (``before``, at ``stamped_ns``); ``changed_input`` trusts the others' stamps."""
    if engine.hashing is None:
        return {}
    unsure = [s for s in sources if not settled_unchanged(s, before, stamped_ns)]
    if not unsure:
        return {}
    return engine.hashing.hash_files(HashJob(files_to_hash(unsure), again=True))


def changed(display: str) -> str:
    return (
        f"{display}: the input changed while it was read (its size, time stamps or contents differ "
        "from before the run); nothing was cached or written; run again once it is no longer being written"
    )


def cached_store(
    path: Path, rule_out_max_len: int | None, check_digests: DigestChecker | None = None
) -> tuple[TokenStore | None, str, list[Message]]:
    """Return the checked cache entry at ``path`` (or None), the cache state, and warnings.

    A damaged entry is never used: it is reported in one warning and made again (state "rebuilt").
    An entry that left out long records untokenized serves only runs that would drop them too: a run
    that truncates, or allows longer samples, makes the entry again (a miss).
    """
    try:
        store = find_store(path, check_digests)
    except DamagedStore as exc:
        return None, "rebuilt", [Message("the cache entry is damaged (", *exc.parts, "); it is rebuilt")]
    # The byte limit is max_len * L, and L is the same (the tokenizer is in the key): comparing max
    # lengths compares limits.
    ruled_out = store.meta.ruled_out_max_len if store is not None else None
    if ruled_out is not None and (rule_out_max_len is None or rule_out_max_len > ruled_out):
        return None, "miss", []
    return store, ("miss" if store is None else "hit"), []
