"""Training checkpoints with Orbax: asynchronous, atomic, last N kept, mesh-independent.

One checkpoint per step holds the train state (parameters, optimizer state, step),
the RNG key, a JSON-able `extra` (counters, the best metric, ...) and every host's
own JSON state (`host_extra`: its Grain iterator position). Orbax writes JSON items
from the primary host only, so each host's state is gathered to all hosts first and
stored as one list; `restore` hands each host its own entry back.

Atomicity: Orbax writes a step into a temporary directory and renames it into place
only once every array and the JSON item are written, so a process killed during a
save leaves the previous checkpoints intact; the partial directory is ignored by
`all_steps()` and restores, and removed by the next save.

Restoring takes an abstract target whose leaves carry the *new* shardings
(`abstract_with_shardings`), so a checkpoint written on one mesh restores onto
another (arrays are saved per shard and re-sliced on read).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxrl import hosts
from jaxrl.train_step import TrainState


def abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct` leaves of `abstract` carrying the matching `shardings`."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


class Checkpointer:
    """Save and restore (train state, RNG key, extra) by step in one directory.

    Args:
        directory: where step directories live (created if missing).
        max_to_keep: the last N finalized checkpoints are kept; None keeps all.
        async_save: write in a background thread; `save` returns once the arrays
            are copied off the devices.
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int | None = 3, async_save: bool = True):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        # Barrier names are per step: without a prefix of their own, two managers saving the same step
        # on several hosts (checkpoints/ and best/) meet at each other's barriers and hang.
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, cleanup_tmp_directories=True,
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                barrier_sync_key_prefix=Path(directory).name))
        # Orbax refuses a relative path (in its save thread, after the step ran).
        self._manager = ocp.CheckpointManager(os.path.abspath(directory), options=options,
                                              item_names=("state", "extra"))

    def save(self, state: TrainState, rng_key: jax.Array, extra: dict[str, Any] | None = None,
             host_extra: Any = None) -> None:
        """Start saving at step `state.step` (a step already saved is an error).

        Every host must call this; `extra` is taken from the primary host, `host_extra`
        from each host (e.g. its data-iterator state).
        """
        step = int(state.step)
        if step in self._manager.all_steps():
            raise ValueError(f"step {step} is already saved")
        key = np.asarray(jax.random.key_data(rng_key))
        # Every host holds the same key; as a global replicated array, Orbax can save it on a pod.
        key = jax.make_array_from_callback(key.shape, state.step.sharding, lambda index: key[index])
        tree = {"train": state, "rng": key}
        extra = {**(extra or {}), "hosts": hosts.gather_json(host_extra)}
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(tree), extra=ocp.args.JsonSave(extra)), force=True)

    def restore(
        self, abstract_state: TrainState, step: int | None = None
    ) -> tuple[TrainState, jax.Array, dict[str, Any]]:
        """Restore `step` (default: the latest) onto the shardings of `abstract_state`.

        Args:
            abstract_state: `TrainState` of `jax.ShapeDtypeStruct`s with shardings (the
                step's, replicated, is used for the RNG key).
            step: which step; None takes the latest finalized one.

        Returns:
            (state, rng_key, extra); `extra["host"]` is this host's `host_extra`.
        """
        self.wait()
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self._manager.directory}")
        key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
        target = {"train": abstract_state,
                  "rng": jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=abstract_state.step.sharding)}
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore()))
        extra = dict(out.extra or {})
        per_host = extra.get("hosts") or [None]
        if len(per_host) != jax.process_count():
            raise ValueError(f"checkpoint {step} was written by {len(per_host)} hosts; this run has "
                             f"{jax.process_count()}")
        extra["host"] = per_host[jax.process_index()]
        key = jax.random.wrap_key_data(jax.numpy.asarray(np.asarray(out.state["rng"])))  # host-local again
        return out.state["train"], key, extra

    def restore_params(self, abstract_params: Any, step: int | None = None) -> tuple[Any, int]:
        """Only the parameters of `step` (default: the latest), onto the shardings of `abstract_params`.

        For inference: the optimizer state and the RNG key stay on disk, so a policy loads
        in a third of the memory and whatever optimizer trained it.

        Returns:
            (params, step).
        """
        self.wait()
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self._manager.directory}")
        if step not in self.all_steps():
            raise FileNotFoundError(f"no checkpoint of step {step} in {self._manager.directory}")
        target = {"train": {"params": abstract_params}}
        # A manager of its own: this one's "state" item is bound to the standard handler, which
        # cannot restore part of a tree.
        reader = ocp.CheckpointManager(self._manager.directory, item_names=("state",))
        try:
            out = reader.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
        finally:
            reader.close()
        return out.state["train"]["params"], step

    def latest_step(self) -> int | None:
        """The newest finalized step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Finalized steps, oldest first."""
        return sorted(self._manager.all_steps())

    def check(self) -> None:
        """Raise the error of an asynchronous save that failed since the last call, if any."""
        self._manager.check_for_errors()

    def wait(self) -> None:
        """Block until any save in flight is finalized."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager's threads."""
        self._manager.close()
