"""The one training loop of every trainer, and what stops it safely.

RL (`jaxrl.trainer`), SFT and DPO (`jaxrl.supervised`; the RECAP refiner is SFT on its
rows) and the demo's SFT (`jaxrl.demo.sft`) differ only in their rows and their loss:
each hands `run_loop` a `step(state, index, timer) -> (state, metrics)`, and the loop
does the rest the same way for all, at the cadence of `Loop`:

    step        the trainer's rows and loss (one jitted, micro-batched update)
    validate    every `eval_every` steps and at the end
    save        every `save_every` steps and at the end: the checkpoint, then the best one
    record      metrics.jsonl (primary host), the curves after a validation, the progress bar

A checkpoint due at a step is written even when its validation fails, and any error
or interruption during a step saves the last completed step first (unless it is saved
already), so `--resume` continues from it with the metrics an uninterrupted run writes.

`interruptible(grace_s)` turns SIGINT (Ctrl-C) and SIGTERM (a pod's preemption notice)
into `Interrupted`: the loop saves, the run's resources close, and the command exits
with 128 + the signal's number (130, 143). A watchdog ends the process `grace_s`
seconds after the signal whatever it waits on (a server that stopped answering), and a
second signal ends it at once; a save cut short leaves the previous checkpoints intact
(they are written atomically).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax

from jaxrl import hosts
from jaxrl import metrics as M
from jaxrl.checkpoint import Checkpointer
from jaxrl.errors import TrainError

DEFAULT_GRACE_S = 60.0


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM); exit with `exit_code`."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def interruptible(grace_s: float = DEFAULT_GRACE_S) -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread while the block runs.

    After the first signal the process has `grace_s` seconds to leave the block (save,
    close); then a watchdog exits with 128 + the signal. A second signal exits at once.
    Outside the main thread (where handlers cannot be set) the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watchdog: list[threading.Timer] = []

    def handler(signum, frame):
        if watchdog:
            print(f"\n{signal.Signals(signum).name} again: exiting now", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        timer = threading.Timer(grace_s, _exit_after_grace, (signum, grace_s))
        timer.daemon = True
        timer.start()
        watchdog.append(timer)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for timer in watchdog:
            timer.cancel()


def _exit_after_grace(signum: int, grace_s: float) -> None:
    print(f"\nstill running {grace_s:g} s after {signal.Signals(signum).name}: exiting now", file=sys.stderr, flush=True)
    os._exit(128 + signum)


@dataclasses.dataclass
class Checkpoints:
    """The run's checkpoints: the last `run.keep_last` (`last`) and the best one by `metric`.

    `extra` is written with every checkpoint (the best value is added); `best_value` is the
    best metric so far (restored on resume).
    """

    last: Checkpointer
    rng: jax.Array
    best: Checkpointer | None = None
    metric: str | None = None
    mode: str = "max"
    best_value: float | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def save(self, state: Any, metrics: dict[str, Any], host_data: Any = None,
             pending: dict[str, Any] | None = None) -> None:
        """Checkpoint `state`; also as the best one when `metric` improved. A failed save is a `SaveError`.

        `pending`: the step's record is not complete (see `save_last`)."""
        value = metrics.get(self.metric) if self.metric else None
        better = (self.best is not None and value is not None and math.isfinite(value)
                  and (self.best_value is None or (value > self.best_value if self.mode == "max"
                                                    else value < self.best_value)))
        if better:
            self.best_value = value
        extra = {**self.extra, "best": self.best_value, **({"pending": pending} if pending else {})}
        try:
            self.last.check()
            self.last.save(state, self.rng, extra, host_data)
            # A kill between the two saves can leave this step in best/ already; it is the same state.
            if better and int(state.step) not in self.best.all_steps():
                self.best.save(state, self.rng, {**extra, "metric": self.metric}, host_data)
        except Exception as e:  # noqa: BLE001 - Orbax raises many kinds; one line, and the run stops here
            raise SaveError(f"step {int(state.step)}: saving the checkpoint failed ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}); continue from the last checkpoint "
                            f"with --resume") from None

    def save_last(self, state: Any, host_data: Any, why: str, pending: dict[str, Any] | None = None) -> None:
        """Save the last completed step before the run ends on `why` (unless it is saved already or lost).

        `pending` is a step whose update is done but whose record is not (its metrics, and whether its
        validation is still due): it is saved with the state, and the resumed run completes it first.
        """
        leaves = jax.tree.leaves(state)
        if any(getattr(x, "is_deleted", lambda: False)() for x in leaves):
            _say(f"{why}: the update of the next step had begun; the last checkpoint is step "
                 f"{self.last.latest_step()}")
            return
        step = int(state.step)
        if step == 0 or step in self.last.all_steps():
            return
        extra = {**self.extra, "best": self.best_value, **({"pending": pending} if pending else {})}
        try:
            self.last.save(state, self.rng, extra, host_data)
            self.last.wait()
        except Exception as e:  # noqa: BLE001 - the run is ending already; say so and keep its first error
            _say(f"{why}: saving step {step} failed ({type(e).__name__}: {e})")
            return
        _say(f"{why}: saved step {step}; continue with --resume")

    def save_best(self, state: Any, metrics: dict[str, Any], host_data: Any) -> None:
        """Save `state` as the best one if `metric` improved (its regular checkpoint exists already)."""
        value = metrics.get(self.metric) if self.metric else None
        if (self.best is not None and value is not None and math.isfinite(value)
                and (self.best_value is None or (value > self.best_value if self.mode == "max"
                                                  else value < self.best_value))):
            self.best_value = value
            if int(state.step) not in self.best.all_steps():
                self.best.save(state, self.rng, {**self.extra, "best": value, "metric": self.metric}, host_data)


class SaveError(TrainError):
    """A checkpoint could not be written; the message says which step and how to continue."""


def _say(msg: str) -> None:
    if hosts.is_primary():
        print(msg, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Loop:
    """How steps `start` … `total` − 1 are driven and recorded.

    Attributes:
        total, start: the run's last step (exclusive) and its first (a resumed run's saved step).
        eval_every, save_every: cadences (0: only at the end).
        validate: `validate(state, done) -> metrics`, or None for no validation.
        checkpoints: where steps are saved, or None (the demo's SFT keeps its policy in memory).
        host_data: this host's data position, saved with each checkpoint (RL's task stream).
        writer: metrics.jsonl (the primary host's), or None.
        on_record: `on_record(done, metrics, validated)` after each step is recorded (RL draws its
            curves after a validation; the supervised trainer keeps its history).
        progress: a tqdm bar, or None; `progress_keys` are the metrics shown beside it.
        timed: add the step's stage times (`time/*`) to its metrics.
        pending: a step saved on an interruption before it was recorded (`Checkpoints.save_last`):
            `{"done", "metrics", "validate"}`; the loop validates it if due, records it, then goes on.
    """

    total: int
    start: int = 0
    eval_every: int = 0
    save_every: int = 0
    validate: Callable[[Any, int], dict[str, Any]] | None = None
    checkpoints: Checkpoints | None = None
    host_data: Callable[[], Any] | None = None
    writer: M.MetricsWriter | None = None
    on_record: Callable[[int, dict[str, Any], bool], None] | None = None
    progress: Any = None
    progress_keys: tuple[str, ...] = ()
    timed: bool = False
    pending: dict[str, Any] | None = None


def due(every: int, done: int, total: int) -> bool:
    """Whether a cadence of `every` steps falls after step `done` (always after the last one)."""
    return done == total or bool(every and done % every == 0)


def run_loop(loop: Loop, state: Any, step: Callable[[Any, int, M.StageTimer], tuple[Any, dict[str, Any]]]
             ) -> tuple[Any, dict[str, Any]]:
    """Run `step` from `loop.start` to `loop.total`; returns the final state and the last step's metrics."""
    data = loop.host_data() if loop.host_data else None
    last: dict[str, Any] = {}
    pending = None
    try:
        if loop.pending is not None:
            last = _complete(loop, state, data, loop.pending)
        for index in range(loop.start, loop.total):
            timer = M.StageTimer()
            state, metrics = step(state, index, timer)
            data = loop.host_data() if loop.host_data else None
            done = index + 1
            validating = loop.validate is not None and due(loop.eval_every, done, loop.total)
            saving = loop.checkpoints is not None and due(loop.save_every, done, loop.total)
            pending = {"done": done, "metrics": metrics, "validate": validating}
            try:
                if validating:
                    with timer("validate"):
                        metrics |= loop.validate(state, done)
                    pending["validate"] = False
            finally:  # a due checkpoint is written even when its validation failed
                if saving:
                    with timer("save"):
                        loop.checkpoints.save(state, metrics, data, pending if pending["validate"] else None)
            if loop.timed:
                metrics |= timer.metrics()
            _record(loop, done, metrics, validating)
            pending, last = None, metrics
    except BaseException as e:
        if loop.checkpoints is not None and not isinstance(e, SaveError):
            why = f"interrupted by {e.args[0]}" if isinstance(e, Interrupted) else f"stopped by {type(e).__name__}"
            loop.checkpoints.save_last(state, data, why, pending)
        raise
    return state, last


def _complete(loop: Loop, state: Any, data: Any, pending: dict[str, Any]) -> dict[str, Any]:
    """Finish the step a resumed run was saved in before it was recorded: its validation, best, record."""
    metrics = dict(pending["metrics"])
    if pending["validate"]:
        metrics |= loop.validate(state, pending["done"])
        if loop.checkpoints is not None:
            loop.checkpoints.save_best(state, metrics, data)
    _record(loop, pending["done"], metrics, pending["validate"])
    return metrics


def _record(loop: Loop, done: int, metrics: dict[str, Any], validated: bool) -> None:
    if loop.writer is not None:
        loop.writer.write(done, metrics)
    if loop.on_record is not None:
        loop.on_record(done, metrics, validated)
    if loop.progress is not None:
        loop.progress.update(1)
        shown = {k.split("/")[-1]: f"{metrics[k]:.3g}" for k in loop.progress_keys
                 if isinstance(metrics.get(k), (int, float)) and math.isfinite(metrics[k])}
        if shown:
            loop.progress.set_postfix(shown)


def interrupted_message(command: str, error: KeyboardInterrupt, out: str | os.PathLike) -> tuple[str, int]:
    """The one line a training command prints when interrupted, and its exit code (128 + the signal)."""
    signum = error.signum if isinstance(error, Interrupted) else signal.SIGINT
    name = signal.Signals(signum).name
    checkpoints = os.path.join(os.fspath(out), "checkpoints")
    saved = os.path.isdir(checkpoints) and any(name.isdigit() for name in os.listdir(checkpoints))
    if saved:
        return f"precisecoder {command}: interrupted by {name}; continue with --resume --out {out}", 128 + signum
    return (f"precisecoder {command}: interrupted by {name} before a step completed; nothing was saved: "
            f"run the same command again, without --resume", 128 + signum)
