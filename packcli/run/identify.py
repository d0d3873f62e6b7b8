"""The run's inputs identified before anything is tokenized: each one's record format (sniffed from its first
records, or remembered with its hash), the run's task, the inputs' content hashes and record counts, and
the tokenizer's key (``run.tokenized`` keys the cache by them).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from packcli.config import PackConfig
from packcli.engines import Engine, HashJob
from packcli.errors import InputError, Opt, Part, RecordError, UsageError, record_fix, where
from packcli.io.fingerprint import Memo
from packcli.io.readers import read_head
from packcli.io.sources import InputSource
from packcli.io.uri import is_uri
from packcli.procs.stop import raise_if_stopped
from packcli.records import preference
from packcli.records.formats import accepted_fields, detect_format
from packcli.run.options import encode_options
from packcli.store.key import default_cache_dir
from packcli.tokenize.batches import worker
from packcli.tokenize.encoders.encoder import Encoder
from packcli.tokenize.encoders.text_encoders import Work
from packcli.tokenize.encoders.tokenizer import tokenizer_fingerprint

T = TypeVar("T")


def _sniff_format(
    source: InputSource, fields: dict[str, str], seen: list[str] | None = None
) -> tuple[str | None, tuple[Part, ...] | None]:
    """Return the record format of a source, from the fields of its first readable records.

    When it cannot be told and a record could not be parsed before the first that could (a first line
    that is no JSON: a header, a note), also return why (where, what and the fix): in input order that,
    not the fields of the records after it, is the problem to report. ``seen`` receives the fields of
    the records read (or what a record is, when it is no object), for the error that names them.
    """
    first_error: tuple[Part, ...] | None = None
    parsed = False
    seen = [] if seen is None else seen
    for batch in read_head(source, 50):
        errors = {pos: (reason, detail) for pos, reason, detail in batch.errors}
        for item, pos in zip(batch.items, batch.positions, strict=True):
            try:
                if pos in errors:
                    raise RecordError(*errors[pos])
                record = worker.parse_line(item) if batch.raw_lines else item
            except RecordError as err:
                unit = "line" if batch.raw_lines else "record"
                if not parsed:
                    first_error = first_error or (
                        f"{where(source.display, unit, pos)}: ",
                        *err.parts,
                        "; ",
                        *record_fix(err.reason),
                    )
                continue
            parsed = True
            for name in record if isinstance(record, dict) else [f"a {type(record).__name__}, not an object"]:
                if str(name) not in seen:
                    seen.append(str(name))
            fmt = detect_format(record, fields)
            if fmt is not None:
                return fmt, None
        break
    return None, first_error


def task_and_formats(config: PackConfig, sources: list[InputSource], memo: Memo) -> tuple[str, dict[str, str | None]]:
    """The run's task (--task, or found from the formats) and each input's record format (remembered in
    ``memo``, the run's hash memo, or sniffed)."""
    task, formats = preference.resolve_task(
        config.task, _record_formats(config, sources, memo), config.overflow, config.output_format, config.truncate_side
    )
    if config.processor is not None and task != "sft":
        found = next(fmt for fmt in formats.values() if fmt in ("preference", "kto"))
        raise UsageError(
            f"the inputs are {found} records, and {task} data with images is not supported yet; leave out ",
            Opt("processor"),
            " or pack SFT records",
        )
    return task, formats


def fields_key(config: PackConfig) -> str:
    """The fields a record format is sniffed with (--field), as the key its memo is kept under."""
    return json.dumps(config.fields, sort_keys=True)


def _record_formats(config: PackConfig, sources: list[InputSource], memo: Memo) -> dict[str, str | None]:
    """Each input's record format (--format, or sniffed from its first records, or remembered from the run
    that last sniffed the file as it is now), by its display name.

    Under --on-error fail, an input whose format cannot be told stops the run, naming its fields.
    """
    formats: dict[str, str | None] = {}
    for source in sources:
        seen: list[str] = []
        fmt: str | None
        if config.format != "auto":
            fmt, unparsed = config.format, None
        elif (known := memo.remembered_format(source, fields_key(config))) is not None:
            fmt, unparsed = known, None
        else:
            fmt, unparsed = _sniff_format(source, config.fields, seen)
        if fmt is None and unparsed is not None and config.on_error == "fail":
            raise InputError(*unparsed)
        if fmt is None and config.on_error == "fail":
            shown = ", ".join(seen[:12]) + (f" and {len(seen) - 12} more" if len(seen) > 12 else "")
            raise InputError(
                f"{source.display}: cannot tell the record format from the fields of its first records "
                f"({shown or 'none'}); a record needs {accepted_fields(config.fields)}",
                hint=("pass ", Opt("format"), ", or ", Opt("fields"), " to name the fields"),
            )
        formats[source.display] = fmt
    return formats


def hashed(
    config: PackConfig,
    sources: list[InputSource],
    engine: Engine,
    memo: Memo,
    spent: list[float],
    later: list[bool] | None = None,
) -> tuple[list[str | None], list[int | None], str, Encoder | None]:
    """The inputs' content hashes and record counts (None where not known without reading an input again),
    the tokenizer's key, and the encoder when the run will need it.

    ``later``: the inputs whose hash the run takes as it tokenizes them (the JSON lines files made into
    cache parts): they are not read here, and their hash is None unless remembered.

    One read of each input hashes it and counts its records (for the progress bar); a file remembered
    by its stamp in ``memo`` (the run's hash memo, which learns the hashes taken here; the caller saves
    it) is not read. Reading the inputs and loading the tokenizer each keep one core busy: where both are
    needed, they run side by side. The thread is joined before any worker process is forked. ``spent``
    receives the seconds of each pass.
    """
    encoder = None

    def timed(work: Callable[[], T]) -> T:
        began = time.perf_counter()
        try:
            return work()
        finally:
            spent.append(time.perf_counter() - began)

    def hashed() -> list[tuple[str | None, int | None]]:
        return [
            (memo.remembered_hash(s) or (None, None)) if then else memo.fingerprint_and_count(s)
            for s, then in zip(sources, later or [False] * len(sources), strict=True)
        ]

    hashing: Future[list[tuple[str | None, int | None]]] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packcli-inputs") as ahead:
        # An engine may hash the input files elsewhere (the Ray engine: in tasks, not on the driver; nor
        # does it count records there).
        found: list[tuple[str | None, int | None]]
        if engine.hashing is not None:
            known = engine.hashing.hash_files(HashJob(memo.files_to_hash(sources)))
            found = [(memo.fingerprint_and_count(s, known, count=False)[0], None) for s in sources]
        elif config.cache:
            found = timed(hashed)  # the key needs them first
        else:
            hashing = ahead.submit(timed, hashed)  # no memo: the cache is off
        tokenizer_key = tokenizer_fingerprint(config.tokenizer_name, config.chat_template)
        if not config.cache or tokenizer_key is None:  # a store will be made, or the key needs the tokenizer
            encoder = run_encoder(config, sources)
        if hashing is not None:
            found = hashing.result()
    raise_if_stopped()
    if tokenizer_key is None:
        assert encoder is not None
        tokenizer_key = encoder.identity()["sha256"] + encoder.identity()["chat_template_sha256"]
    return [f for f, _ in found], [n for _, n in found], tokenizer_key, encoder


def run_encoder(config: PackConfig, sources: list[InputSource] | None = None) -> Encoder:
    """The run's encoder: its tokenizer and template loaded, with its processor, if any.

    ``sources``: the inputs it will tokenize (all of them when None), whose size decides whether the fast
    encoder pays for its load (``text_encoders.Work``). The tokenizer is opened from its record in the
    cache, which learns it, unless the run writes nothing there (``--no-cache``, a dry run).
    """
    records = None
    if config.cache and not config.dry_run:
        records = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    size = input_bytes(sources) if sources is not None else None
    work = Work(size, config.num_proc) if size is not None else None
    return Encoder(
        config.tokenizer_name,
        config.chat_template,
        encode_options(config),
        config.processor,
        encoder=config.encoder,
        records=records,
        work=work,
    )


def input_bytes(sources: list[InputSource]) -> int | None:
    """The bytes of the inputs on local disk (as stored: compressed ones count their compressed size, times
    four); None when one is not a local file (a URI, a Hub dataset, a saved dataset's directory)."""
    total = 0
    for source in sources:
        if source.kind in ("hub", "saved_dataset") or is_uri(source.path):
            return None
        try:
            size = os.path.getsize(source.path)
        except OSError:
            return None
        total += size * (4 if source.compression else 1)
    return total
