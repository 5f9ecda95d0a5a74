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


def row_block(sharding: jax.sharding.Sharding, rows: int) -> tuple[int, int]:
    """The rows [start, stop) of a `[rows, ...]` array under `sharding` that this host's devices hold.

    Raises ValueError when they are not one contiguous block that splits the rows evenly over
    the hosts (the layout `jax.make_array_from_process_local_data` fills from each host's rows).
    """
    spans = {(s.start or 0, rows if s.stop is None else s.stop)
             for s, *_ in sharding.addressable_devices_indices_map((rows,)).values()}
    start, stop = min(a for a, _ in spans), max(b for _, b in spans)
    covered = sum(b - a for a, b in spans)
    if covered != stop - start or (stop - start) * jax.process_count() != rows:
        raise ValueError(f"the rows of a [{rows}] array are not split into one block per host by {sharding}")
    return start, stop


def from_host_rows(x: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """The global array whose block of rows on this host's devices is `x` (same shape on every host)."""
    return jax.make_array_from_process_local_data(sharding, np.asarray(x), (x.shape[0] * jax.process_count(),
                                                                            *x.shape[1:]))


def host_rows(x: jax.Array, block: tuple[int, int]) -> np.ndarray:
    """Rows [start, stop) of a global array, read from this host's addressable shards (nothing crosses hosts)."""
    start, stop = block
    if x.is_fully_addressable:
        return np.asarray(x)[start:stop]
    out = np.empty((stop - start, *x.shape[1:]), x.dtype)
    filled = np.zeros(out.shape, bool)
    for shard in x.addressable_shards:
        rows, *rest = shard.index
        lo, hi = max(rows.start or 0, start), min(x.shape[0] if rows.stop is None else rows.stop, stop)
        if lo < hi:
            data = np.asarray(shard.data)[lo - (rows.start or 0):hi - (rows.start or 0)]
            out[(slice(lo - start, hi - start), *rest)] = data
            filled[(slice(lo - start, hi - start), *rest)] = True
    if not filled.all():
        raise ValueError(f"rows {start}:{stop} of a {x.shape} array are not all on this host's devices")
    return out


def all_rows(x: jax.Array) -> np.ndarray:
    """A global array's value on every host (for decisions every host must take alike)."""
    if x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class HostsDisagree(ValueError):
    """Hosts that must run alike do not; the message names the first differing item."""


def check_same(items: dict[str, str]) -> None:
    """Raise `HostsDisagree` on every host when some host's `items` differ from host 0's.

    The first item (in host 0's order) in which any host differs is named, with both values.
    """
    if jax.process_count() == 1:
        return
    every = gather_json(items)
    for name in dict.fromkeys(k for host in every for k in host):
        for p, host in enumerate(every[1:], 1):
            mine, first = host.get(name, "<absent>"), every[0].get(name, "<absent>")
            if mine != first:
                raise HostsDisagree(f"hosts disagree: host {p}'s {name} is {mine[:120]}, host 0's is {first[:120]}")
