"""The Ray session of the Ray engine: connect to a cluster (or start a local instance), and stop it after."""

from __future__ import annotations

import logging
import os
import re
import socket
from typing import Any

import ray

from packcli.config import PackConfig
from packcli.errors import PackcliError, first_line

# Whether this process started the Ray instance it uses (then it also shuts it down).
_STARTED_HERE = {"value": False}


class RayEngineError(PackcliError):
    """Ray could not be reached, or a worker failed outside of packcli's own error handling."""


def ensure_ray(config: PackConfig) -> None:
    """Connect to ``--ray-address``, or use the instance already running in this process, or start one.

    A local instance started here gets ``--num-proc`` CPUs. Tokenizer actors and writer tasks take one
    CPU each, and there are as many actors as the instance or cluster has CPUs.
    """
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    address = config.ray_address
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # "local": a new instance, even where `ray start` left a cluster running on this machine
        # (pass --ray-address auto to use that one).
        address = "local"
        kwargs["num_cpus"] = config.num_proc
    elif address is not None:
        _check_reachable(address)
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = first_line(exc)
        where = "a local Ray instance" if address == "local" else f"the Ray cluster at {address or 'RAY_ADDRESS'}"
        raise RayEngineError(f"cannot start or reach {where} ({first}); check --ray-address") from exc
    _STARTED_HERE["value"] = True


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
        f"--ray-address {address}: nothing answers there ({error.strerror or error}); check the address "
        "(the head node's host:port, e.g. head-node:6379) and that the cluster is up"
    ) from error


def shutdown_if_started_here() -> None:
    if _STARTED_HERE["value"] and ray.is_initialized():
        ray.shutdown()
    _STARTED_HERE["value"] = False


def cluster_cpus() -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def quiet_ray_data(context: Any) -> None:
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    for name in ("enable_operator_progress_bars", "enable_auto_log_stats"):
        if hasattr(context, name):
            setattr(context, name, False)
    # Ray Data says at INFO/WARNING level that it shows no progress bars: packcli shows its own.
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)


# -- stage 1: tokenize on the cluster --------------------------------------------------------------
