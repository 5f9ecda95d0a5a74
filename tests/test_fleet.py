"""The fleet: ordered results, the content-addressed cache, crash recovery, Grain."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from reward import sandbox
from reward.fleet import Fleet, grain_dataset
from reward.sandbox import Job, Limits, RunResult, WorkerDied
from reward.schema import AssertTests, IOCase, IOTests

LIMITS = Limits(timeout_s=3.0)


def square_job(i: int, wrong: bool = False) -> Job:
    program = f"def sq(x):\n    return x * x{' + 1' if wrong else ''}\n"
    return Job(program, AssertTests(f"assert sq({i}) == {i * i}\n"), LIMITS)


def test_results_come_back_in_order():
    jobs = [square_job(i, wrong=i % 3 == 0) for i in range(24)]
    with Fleet(workers=2, cache=False) as fleet:
        results = fleet.run(jobs)
    assert [r.passed for r in results] == [i % 3 != 0 for i in range(24)]
    assert fleet.stats.runs == 24


def test_identical_jobs_run_once_within_and_across_batches():
    with Fleet(workers=2) as fleet:
        first = fleet.run([square_job(1), square_job(2), square_job(1), square_job(1)])
        assert fleet.stats.runs == 2 and fleet.stats.cache_hits == 2
        assert [r.cached for r in first] == [False, False, True, True]
        second = fleet.run([square_job(2), square_job(3)])
        assert fleet.stats.runs == 3
        assert second[0].cached and second[0].passed and not second[1].cached
    # Limits are part of the address: the same program under another limit runs again.
    assert square_job(1).key() != Job(square_job(1).program, square_job(1).tests, Limits(timeout_s=4)).key()


def test_cache_off_runs_every_job():
    with Fleet(workers=1, cache=False) as fleet:
        fleet.run([square_job(1)] * 3)
    assert fleet.stats.runs == 3


def test_persistent_cache_survives_a_new_fleet(tmp_path):
    path = tmp_path / "runs.jsonl"
    with Fleet(workers=1, cache_path=path) as fleet:
        before = fleet.run([square_job(5), square_job(6, wrong=True)])
    with open(path, "a") as f:
        f.write('{"key": "torn')  # a crash mid-write leaves a partial line
    with Fleet(workers=1, cache_path=path) as fleet:
        after = fleet.run([square_job(5), square_job(6, wrong=True)])
        assert fleet.stats.runs == 0
    assert [(r.passed, r.status) for r in before] == [(r.passed, r.status) for r in after]


def test_a_killed_worker_is_replaced_and_its_job_retried():
    slow = Job("import time\ntime.sleep(1.0)\n", AssertTests("assert True\n"), LIMITS)
    with Fleet(workers=1, cache=False) as fleet:
        fleet.run([square_job(1)])  # start the worker
        sandbox_pid = fleet._workers[0].sandbox_pid

        def kill_soon():
            time.sleep(0.3)
            os.kill(sandbox_pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_soon)
        killer.start()
        result = fleet.run([slow])[0]
        killer.join()
        assert result.passed, result
        assert fleet.stats.retries == 1 and fleet.stats.worker_restarts >= 1
        assert fleet.run([square_job(2)])[0].passed


def test_a_job_that_kills_workers_twice_is_reported_as_error(monkeypatch):
    def always_dies(self, job):
        raise WorkerDied("simulated crash")

    with Fleet(workers=1, cache=True) as fleet:
        monkeypatch.setattr(sandbox.SandboxWorker, "run", always_dies)
        result = fleet.run([square_job(1)])[0]
        assert result.status == "error" and not result.passed
        assert "failed twice" in result.stderr
        monkeypatch.undo()
        # Infrastructure errors are not cached: the job runs for real next time.
        assert fleet.run([square_job(1)])[0].passed


def test_io_and_assert_jobs_mix():
    io = Job("print(sum(map(int, input().split())))\n", IOTests((IOCase("1 2 3\n", "6\n"),)), LIMITS)
    with Fleet(workers=2) as fleet:
        results = fleet.run([io, square_job(4)])
    assert [r.status for r in results] == ["pass", "pass"]


def test_rlimits_fallback_warns_loudly_and_still_runs():
    with pytest.warns(RuntimeWarning, match="WITHOUT namespaces"):
        fleet = Fleet(workers=1, isolation="rlimits")
    with fleet:
        results = fleet.run([square_job(3), square_job(3, wrong=True),
                             Job("while True:\n    pass\n", AssertTests(""), Limits(timeout_s=1))])
    assert [r.status for r in results] == ["pass", "fail", "timeout"]


def test_grain_dataset_matches_the_fleet():
    jobs = [square_job(i, wrong=i % 2 == 0) for i in range(6)]
    results = list(grain_dataset(jobs, workers=2))
    assert all(isinstance(r, RunResult) for r in results)
    assert [r.passed for r in results] == [i % 2 == 1 for i in range(6)]



@pytest.mark.skipif(os.geteuid() != 0, reason="dedicated sandbox uids are used only as root")
def test_close_leaves_no_sandbox_process():
    from test_sandbox import processes_of

    fleet = Fleet(workers=2)
    fleet.run([square_job(i) for i in range(4)])
    uids = fleet.worker_uids()
    assert len(uids) == 2 and len(processes_of(uids)) == 2
    fleet.close()
    deadline = time.monotonic() + 5
    while processes_of(uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(uids) == []
