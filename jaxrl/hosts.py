"""Multi-host plumbing with JAX's own runtime: joining the hosts, gathering host-local data.

On a pod every host runs the same command; `initialize` joins them with
`jax.distributed.initialize` (arguments auto-detected on TPU pods and SLURM, or
given explicitly), and on the CPU it selects the gloo collectives so that several
processes on one machine form one global mesh. With one process all of this is
the identity.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = False) -> None:
    """Join the other hosts.

    With `auto` and no explicit arguments, JAX detects the hosts (Cloud TPU pods,
    SLURM). Without either, this is a no-op: a single process.
    """
    if coordinator is None and num_processes is None and not auto:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Hosts reach the end at different times (the primary also writes metrics and plots):
    # a generous shutdown barrier keeps a slow primary from being killed as a straggler.
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
                               shutdown_timeout_seconds=1800)


def gather_rows(x: np.ndarray) -> np.ndarray:
    """Every host's `x` concatenated along axis 0 in process order (same shape on every host)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=True))


def gather_json(obj: Any) -> list[Any]:
    """Every host's JSON-able `obj`, in process order, on every host."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.asarray([data.size], np.int64), tiled=True)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = multihost_utils.process_allgather(padded[None], tiled=True)
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(np.asarray(rows), sizes)]


def is_primary() -> bool:
    """This is the host that writes shared files (metrics, plots, the config)."""
    return jax.process_index() == 0
