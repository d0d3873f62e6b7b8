"""Hub inputs: a dataset of the Hugging Face Hub loaded with ``datasets`` (from its local cache when offline)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

from packcli.errors import InputError, first_line
from packcli.io.sources import InputSource


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

    host = urlparse(endpoint).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


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
