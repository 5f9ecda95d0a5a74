"""`precisecoder train` with `rollout.engine: sglang` against two REAL sglang-jax servers (`precisecoder serve`).

The servers start on an unrelated random checkpoint; the engine pushes the trainer's initial
policy before step 1 and the new weights after every step. The sampler's log-probs must equal
the trainer's recomputed ones (`update/logp_gap_max`) at every step: at step 1 that shows the
servers sample the trainer's policy, at steps 2 and 3 that each push reached both servers.
"""

import pytest
from sglang_jax_servers import ARCH, needs_sglang_jax, save_random_qwen3, serve
from test_train_e2e import finish, records, train, write_config

from jaxrl.rollout.http import request_json

pytestmark = [needs_sglang_jax, pytest.mark.slow]  # ~1 min for two servers, ~1.5 min of training


def test_three_steps_against_two_servers_sample_the_trained_policy(tmp_path):
    launch = save_random_qwen3(tmp_path / "launch", seed=7)
    out, weights = tmp_path / "run", tmp_path / "weights"
    with serve(launch, launch) as urls:
        cfg = write_config(tmp_path / "sglang.yaml", out, model={"architecture": ARCH},
                           rollout={"engine": "sglang", "options": {"urls": urls, "weights_dir": str(weights)}},
                           run={"steps": 3, "eval_every": 0, "save_every": 0})
        finish(train("--config", cfg))
        served = [request_json("GET", url + "/get_model_info")["model_path"] for url in urls]
    rows = records(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["update/logp_gap_max"] <= 1e-4, (r["step"], r["update/logp_gap_max"])
    assert served == [str((weights / "step-00000003").resolve())] * 2
    assert rows[-1]["val/pass"] is not None  # validation sampled through the servers too
