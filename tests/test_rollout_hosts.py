"""The `jax` engine on several hosts: 2 processes x 4 CPU devices sample what 1 process x 8 samples."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "tests" / "rollout_hosts_runner.py"


def _run(args, devices, log):
    """The runner with its output in `log` (a pipe nobody reads could block a host that another waits for)."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(RUNNER), *map(str, args)], env=env, cwd=REPO,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True)


def _finish(proc, log):
    proc.wait(timeout=1800)
    assert proc.returncode == 0, Path(log).read_text()[-3000:]


@pytest.mark.slow  # about 2 min of CPU here: three processes, each compiling the engine's programs
def test_two_hosts_sample_what_one_host_samples(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = [tmp_path / f"{name}.log" for name in ("host0", "host1", "one")]
    procs = [_run([tmp_path / f"host{i}.json", port, i, 2], 4, logs[i]) for i in range(2)]
    procs.append(_run([tmp_path / "one.json"], 8, logs[2]))
    for p, log in zip(procs, logs):
        _finish(p, log)
    one = json.loads((tmp_path / "one.json").read_text())
    h0, h1 = (json.loads((tmp_path / f"host{i}.json").read_text()) for i in range(2))
    assert [len(c) for c in h0] == [3, 3, 1] and [len(c) for c in h1] == [2, 2, 0]
    for call, (a, b, whole) in enumerate(zip(h0, h1, one)):
        joined = a + b
        assert len(joined) == len(whole), call
        for g2, g1 in zip(joined, whole):
            assert [c["tokens"] for c in g2] == [c["tokens"] for c in g1], call
            assert [c["finish"] for c in g2] == [c["finish"] for c in g1], call
            for c2, c1 in zip(g2, g1):
                np.testing.assert_allclose(c2["logprobs"], c1["logprobs"], rtol=1e-5, atol=1e-6)
    # the script is worth checking: rows stop at different steps (compaction), samples of a prompt differ
    first = [c for group in one[0] for c in group]
    assert {c["finish"] for c in first} == {"stop", "length"}
    assert len({len(c["tokens"]) for c in first}) > 2
    assert len({tuple(c["tokens"]) for c in one[1][0]}) > 1
