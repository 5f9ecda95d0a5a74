"""The one training loop (`jaxrl.loop`): cadences, a checkpoint written even when validation fails, the last
completed step saved on an error or a signal, and a step saved before it was recorded completed on resume.

The step here is a counter on a one-parameter state, so what is tested is the loop's bookkeeping; the
trainers' use of it is tested with real models in test_supervised.py, test_trainer_loop.py and test_demo_sft.py.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxrl import metrics as M
from jaxrl.checkpoint import Checkpointer
from jaxrl.loop import Checkpoints, Interrupted, Loop, interrupted_message, interruptible, run_loop
from jaxrl.train_step import TrainState

REPO = Path(__file__).resolve().parents[1]


def fresh_state() -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.zeros(2)}, opt_state=())


def counting_step(fail_at=None, error=None):
    """step(state, index, timer): w += index + 1; raises `error` when asked to run step `fail_at`."""

    def step(state, index, timer):
        if index == fail_at:
            raise error
        w = state.params["w"] + (index + 1)
        return TrainState(step=state.step + 1, params={"w": w}, opt_state=()), {"w": float(w[0])}

    return step


def open_loop(tmp_path, total, *, validate=None, save_every=0, pending=None, start=0):
    checkpoints = Checkpoints(Checkpointer(tmp_path / "checkpoints", max_to_keep=None), jax.random.key(0),
                              Checkpointer(tmp_path / "best", max_to_keep=1), "val", "max")
    writer = M.MetricsWriter(tmp_path, False, start or None)
    data = {"position": 0}
    loop = Loop(total, start, eval_every=2, save_every=save_every, validate=validate, checkpoints=checkpoints,
                host_data=lambda: dict(data), writer=writer, pending=pending)
    return loop, checkpoints, writer


def restore(checkpoints):
    abstract = jax.eval_shape(fresh_state)
    return checkpoints.last.restore(abstract)


def lines(tmp_path):
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_a_due_checkpoint_is_written_when_its_validation_fails(tmp_path):
    def validate(state, done):
        raise RuntimeError("the fleet is gone")

    loop, checkpoints, writer = open_loop(tmp_path, 2, validate=validate)
    with pytest.raises(RuntimeError, match="fleet"):
        run_loop(loop, fresh_state(), counting_step())
    checkpoints.last.wait()
    assert checkpoints.last.all_steps() == [2]
    state, _, extra = restore(checkpoints)
    assert int(state.step) == 2 and extra["pending"] == {"done": 2, "metrics": {"w": 3.0}, "validate": True}


def test_an_interrupted_step_saves_the_last_completed_one_and_resume_gives_the_uninterrupted_metrics(tmp_path):
    def validate(state, done):
        return {"val": float(state.params["w"][0]) / 10}

    whole, _, writer = open_loop(tmp_path / "whole", 5, validate=validate)
    run_loop(whole, fresh_state(), counting_step())
    writer.close()

    part = tmp_path / "part"
    loop, checkpoints, writer = open_loop(part, 5, validate=validate)
    with pytest.raises(Interrupted):
        run_loop(loop, fresh_state(), counting_step(fail_at=3, error=Interrupted(signal.SIGTERM)))
    writer.close()
    assert checkpoints.last.all_steps() == [3]  # only the end was due: step 3 saved by the interruption
    state, _, extra = restore(checkpoints)
    assert "pending" not in extra and int(state.step) == 3
    loop, checkpoints, writer = open_loop(part, 5, validate=validate, start=3)
    run_loop(loop, state, counting_step())
    writer.close()
    assert lines(part) == lines(tmp_path / "whole")
    assert checkpoints.best.all_steps() == [5]


def test_a_step_interrupted_in_its_validation_is_completed_by_the_resumed_run(tmp_path):
    calls = []

    def validate(state, done):
        calls.append(done)
        if len(calls) == 2 and interrupt:
            raise Interrupted(signal.SIGINT)
        return {"val": float(state.params["w"][0])}

    interrupt = False
    whole, _, writer = open_loop(tmp_path / "whole", 5, validate=validate)
    run_loop(whole, fresh_state(), counting_step())
    writer.close()

    calls.clear()
    interrupt = True
    part = tmp_path / "part"
    loop, checkpoints, writer = open_loop(part, 5, validate=validate)
    with pytest.raises(Interrupted):
        run_loop(loop, fresh_state(), counting_step())  # validations at 2, then 4: interrupted there
    writer.close()
    state, _, extra = restore(checkpoints)
    assert int(state.step) == 4 and extra["pending"]["validate"] is True
    interrupt = False
    loop, checkpoints, writer = open_loop(part, 5, validate=validate, pending=extra["pending"], start=4)
    run_loop(loop, state, counting_step())
    writer.close()
    assert lines(part) == lines(tmp_path / "whole") and calls == [2, 4, 4, 5]


def test_interruptible_turns_sigterm_into_interrupted_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as e:
        with interruptible(30):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10 ** 7):  # the handler runs between bytecodes
                pass
    assert e.value.exit_code == 143 and signal.getsignal(signal.SIGTERM) == before


def test_interrupted_messages_say_whether_there_is_something_to_resume(tmp_path):
    line, code = interrupted_message("train", Interrupted(signal.SIGTERM), tmp_path)
    assert code == 143 and "before a step completed" in line and "without --resume" in line
    (tmp_path / "checkpoints" / "4").mkdir(parents=True)
    line, code = interrupted_message("train", KeyboardInterrupt(), tmp_path)
    assert code == 130 and line == f"precisecoder train: interrupted by SIGINT; continue with --resume --out {tmp_path}"


def test_a_second_signal_or_the_grace_period_ends_a_hung_process():
    """A block that ignores the first signal's exception (a wait that swallows it) still ends: by the
    watchdog after the grace period, or at once on a second signal."""
    code = textwrap.dedent("""
        import os, signal, sys, time
        from jaxrl.loop import interruptible
        told = False
        with interruptible(float(sys.argv[1])):
            while True:
                try:
                    if not told:
                        told = print("ready", flush=True) or True
                    time.sleep(60)
                except KeyboardInterrupt:
                    pass  # a hung clean-up
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    for grace, signals, expected in ((1.0, [signal.SIGTERM], 143), (600.0, [signal.SIGINT, signal.SIGINT], 130)):
        proc = subprocess.Popen([sys.executable, "-c", code, str(grace)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"
        for s in signals:
            proc.send_signal(s)
            if len(signals) > 1:
                time.sleep(0.5)
        assert proc.wait(timeout=60) == expected
        assert "exiting now" in proc.stderr.read()
