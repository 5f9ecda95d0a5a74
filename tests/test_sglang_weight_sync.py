"""Weight sync without a race: a two-process `precisecoder train` on SGLang (a fake server that is slow to update).

Only process 0 posts `/update_weights_from_disk`; process 1 must not send the next step's
`/generate` before that update has been answered. The fake takes 3 s per update, so a host
that did not wait would show up as a `/generate` arriving inside an update.
"""

import pytest
from fake_servers import FakeSGLang
from test_train_e2e import finish, free_port, records, train, write_config


@pytest.mark.slow  # two `precisecoder train` processes, 3 s per weight update: 9 min here at load average 30
def test_no_host_samples_before_the_servers_acknowledged_the_update(tmp_path):
    server = FakeSGLang(update_delay=3.0)
    try:
        out = tmp_path / "run"
        cfg = write_config(tmp_path / "sync.yaml", out,
                           rollout={"engine": "sglang", "options": {"urls": [server.url],
                                                                    "weights_dir": str(tmp_path / "weights")}},
                           data={"tasks_per_step": 4}, run={"steps": 2, "eval_every": 0, "save_every": 0})
        port = free_port()
        procs = [train("--config", cfg, "--coordinator", f"127.0.0.1:{port}", "--num-processes", 2,
                       "--process-id", i, devices=4) for i in range(2)]
        for p in procs:
            finish(p)
    finally:
        server.close()
    assert [r["step"] for r in records(out)] == [1, 2]
    kinds = [k for _, k in sorted(server.events)]
    # the initial push, then one per step; each update answered before any later /generate arrived
    assert kinds.count("update") == kinds.count("updated") == 3
    inside, generated = False, 0
    for kind in kinds:
        if kind == "update":
            inside = True
        elif kind == "updated":
            inside = False
        else:
            assert not inside, f"a /generate reached the server during a weight update: {kinds}"
            generated += 1
    # both hosts sampled every step (4 prompts per step over 2 hosts), and validation after the last push
    assert generated >= 2 * 4 and kinds[0] == "update" and kinds[1] == "updated"
