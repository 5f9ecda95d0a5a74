"""Weight sync without a race: a two-process `precisecoder train` on SGLang (a fake server that is slow to update).

Only process 0 posts `/update_weights_from_disk`; process 1 must not send the next step's
`/generate` before that update has been answered. The fake takes 3 s per update, so a host
that did not wait would show up as a `/generate` arriving inside an update or before it.
"""

import pytest
from fake_servers import FakeSGLang
from test_train_e2e import finish, free_port, records, train, write_config


@pytest.mark.slow  # two `precisecoder train` processes, 3 s per weight update: 1.8 to 9 min here (load average 5 to 30)
def test_no_host_samples_before_the_servers_acknowledged_the_update(tmp_path):
    server = FakeSGLang(update_delay=3.0)
    try:
        out = tmp_path / "run"
        cfg = write_config(tmp_path / "sync.yaml", out,
                           rollout={"engine": "sglang", "options": {"urls": [server.url],
                                                                    "weights_dir": str(tmp_path / "weights")}},
                           data={"tasks_per_step": 4},
                           # no best checkpoint: its async save next to the last step's has failed in
                           # Orbax's multi-host barrier here ("Barrier ... set_value_start is already ongoing")
                           run={"steps": 2, "eval_every": 0, "save_every": 0, "best_metric": None})
        port = free_port()
        procs = [train("--config", cfg, "--coordinator", f"127.0.0.1:{port}", "--num-processes", 2,
                       "--process-id", i, devices=4) for i in range(2)]
        for p in procs:
            finish(p)
    finally:
        server.close()
    assert [r["step"] for r in records(out)] == [1, 2]
    events = sorted(server.events, key=lambda e: e[0])
    kinds = [k for _, k, _ in events]
    # the initial push, then one after each step
    assert kinds.count("update") == kinds.count("updated") == 3 and kinds[:2] == ["update", "updated"]
    # Between the answer to update k-1 and the start of update k lie exactly step k's rollouts:
    # one first request per prompt, which asks for the most tokens (a continuation asks for
    # fewer). A host that did not wait for update k-1 would put its step-(k+1) requests into
    # this window or inside the update.
    windows, inside = [[]], False
    for _, kind, body in events:
        if kind == "update":
            inside = True
        elif kind == "updated":
            inside = False
            windows.append([])
        else:
            assert not inside, f"a /generate reached the server during a weight update: {kinds}"
            windows[-1].append(body["sampling_params"][0]["max_new_tokens"])
    assert windows[0] == []  # nothing sampled before the initial policy was pushed
    first = max(windows[1] + windows[2])
    for step, window in zip((1, 2), windows[1:3]):
        assert window.count(first) == 4, (step, window)  # 4 prompts per step over the 2 hosts
    assert windows[3]  # validation, after the last push
