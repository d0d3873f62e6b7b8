"""Hub inputs: a dataset of the Hugging Face Hub loaded with ``datasets`` (from its local cache when offline)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from packcli.contract import hub_reachable
from packcli.errors import InputError, Message, first_line
from packcli.io.sources import InputSource


def read_hub(source: InputSource, batch_size: int) -> Iterator[Any]:
    """Load a Hub dataset with ``datasets``; without the Hub, from the local Hugging Face cache only."""
    online = hub_reachable()
    try:
        import datasets

        with _offline(not online):
            ds = datasets.load_dataset(source.path, split=source.split)
    except Exception as exc:  # the Hub client raises many unrelated types for one failure
        first = first_line(exc)
        if not online:
            raise InputError(
                f"{source.display}: the Hugging Face Hub cannot be reached and the dataset is not in the local "
                f"cache ({first}); load it once where there is network, or save it with datasets.save_to_disk "
                "and pass the directory"
            ) from exc
        raise InputError(
            f"{source.display}: cannot load the Hub dataset ({first}); check the name and split, "
            "the network, or save it locally with datasets.save_to_disk and pass the directory"
        ) from exc
    yield from ds.data.to_batches(max_chunksize=batch_size)


@contextlib.contextmanager
def _offline(offline: bool) -> Iterator[None]:
    """Run ``datasets`` in offline mode (as HF_HUB_OFFLINE=1 does): cached datasets load, nothing waits on the net."""
    if not offline:
        yield
        return
    import datasets.config
    import huggingface_hub.constants as hub_constants
    from datasets.utils import logging as datasets_logging

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE, datasets_logging.get_verbosity())
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    # datasets logs that it uses the cached version; packcli says so once, in its own warning.
    datasets_logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved[:2]
        datasets_logging.set_verbosity(saved[2])


def unreachable(sources: list[InputSource]) -> list[Message]:
    """What is said of the Hub datasets among the inputs when the Hub cannot be reached (they are read from
    the local Hugging Face cache)."""
    if not any(s.kind == "hub" for s in sources) or hub_reachable():
        return []
    message = ": the Hugging Face Hub cannot be reached; read from the local Hugging Face cache"
    return [Message(f"{s.display}{message}") for s in sources if s.kind == "hub"]
