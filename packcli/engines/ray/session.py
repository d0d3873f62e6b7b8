"""The Ray session of the Ray engine: connect to a cluster (or start a local instance), and stop it after."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import socket
from typing import Any

import ray

from packcli.errors import Opt, PackcliError, first_line

# Ray's own retries: a tokenizer actor that dies (a crashed or lost node) is restarted and its part run
# again, a writer task that dies is run again. Both are idempotent: a part's segment and a shard are
# written whole under a name of their own, so a second run overwrites the first.
ACTOR_RESTARTS = 2
TASK_RETRIES = 2


class RayEngineError(PackcliError):
    """Ray could not be reached, or a worker failed outside of packcli's own error handling."""


class RaySession:
    """One run's use of Ray: the instance it connects to (or starts, and then stops), and what it received.

    ``received`` counts the bytes and objects the driver fetched from the cluster: the measure behind
    "the driver handles lengths, not tokens" (tests/test_ray.py checks it).
    """

    def __init__(self, address: str | None = None, num_cpus: int = 1) -> None:
        self.address, self.num_cpus = address, num_cpus
        self.started_here = False  # this session started the Ray instance it uses (then it also stops it)
        self.received = {"bytes": 0, "objects": 0}

    def ensure(self) -> None:
        """Connect to ``--ray-address``, or use the instance already running in this process, or start one.

        A local instance started here gets ``--num-proc`` CPUs. Tokenizer actors and writer tasks take
        one CPU each, and there are as many actors as the instance or cluster has CPUs.
        """
        if ray.is_initialized():
            return
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
        address = self.address
        if address is None and not os.environ.get("RAY_ADDRESS"):
            # "local": a new instance, even where `ray start` left a cluster running on this machine
            # (pass --ray-address auto to use that one).
            address = "local"
            kwargs["num_cpus"] = self.num_cpus
        elif address is not None:
            _check_reachable(address)
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = first_line(exc)
            where = "a local Ray instance" if address == "local" else f"the Ray cluster at {address or 'RAY_ADDRESS'}"
            raise RayEngineError(
                f"cannot start or reach {where} ({first})", hint=("check ", Opt("ray_address"))
            ) from exc
        self.started_here = True

    def shutdown_if_started_here(self) -> None:
        """Stop the Ray instance when this session started it."""
        if self.started_here and ray.is_initialized():
            ray.shutdown()
        self.started_here = False

    def fetch(self, ref: Any) -> Any:
        """``ray.get`` of an object that a task returns pickled (bytes), counted in ``received``."""
        try:
            data = ray.get(ref)
        except ray.exceptions.RayError as exc:
            raise worker_error(exc) from exc
        self.received["bytes"] += len(data)
        self.received["objects"] += 1
        return pickle.loads(data)


def pickled(value: Any) -> bytes:
    """What a task returns: its result pickled, so that the driver counts the bytes it receives."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def worker_error(exc: BaseException) -> PackcliError:
    """A packcli error raised in a worker keeps its message; anything else becomes one line."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, PackcliError) and not isinstance(cause, ray.exceptions.RayError):
            return cause
        cause = getattr(cause, "cause", None) or cause.__cause__
    text = str(exc).strip().splitlines()
    last = next((line.strip() for line in reversed(text) if line.strip()), type(exc).__name__)
    ours = re.search(r"packcli\.[\w.]+Error: (.+)", str(exc))  # a packcli error that Ray kept only as text
    if ours:
        return RayEngineError(ours.group(1).strip())
    return RayEngineError(f"a Ray worker failed ({last[:300]})")


def kill(actors: list[Any]) -> None:
    """Kill actors (without restarts), whatever state they are in."""
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a, no_restart=True)


def _check_reachable(address: str) -> None:
    """Fail at once on a ``host:port`` that nothing listens on (Ray itself retries for minutes)."""
    match = re.fullmatch(r"(?:ray://)?\[?([^\]/]+?)\]?:(\d+)", address)
    if match is None:
        return  # "auto", "local", or a form Ray resolves itself
    host, port = match.group(1), int(match.group(2))
    hosts, error = [host], OSError("no address")
    if host in ("localhost", "::1") or host.startswith("127."):
        hosts.append(ray.util.get_node_ip_address())  # a local head listens on this machine's address
    for candidate in hosts:
        try:
            socket.create_connection((candidate, port), timeout=10).close()
            return
        except OSError as exc:
            error = exc
    raise RayEngineError(
        f"{address}: nothing answers there ({error.strerror or error}); check the address "
        "(the head node's host:port, e.g. head-node:6379) and that the cluster is up",
        option="ray_address",
    ) from error


def cluster_cpus() -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
