"""The fleet: ordered results, the content-addressed cache, crash recovery, concurrent callers, Grain."""

from __future__ import annotations

import os
import sys
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


def test_grain_dataset_leaves_absl_flags_to_the_application(monkeypatch):
    from absl import flags

    monkeypatch.setattr(type(flags.FLAGS), "is_parsed", lambda self: False)
    with pytest.raises(RuntimeError, match="absl"):
        grain_dataset([square_job(0)], workers=1)


def test_grain_dataset_matches_the_fleet():
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS(sys.argv[:1])  # what an application's entry point does
    jobs = [square_job(i, wrong=i % 2 == 0) for i in range(6)]
    results = list(grain_dataset(jobs, workers=2))
    assert all(isinstance(r, RunResult) for r in results)
    assert [r.passed for r in results] == [i % 2 == 1 for i in range(6)]



@pytest.mark.skipif(os.geteuid() != 0, reason="dedicated sandbox uids are used only as root")
def test_close_leaves_no_sandbox_process():
    from test_sandbox import IDLE_PROCESSES_PER_WORKER, processes_of

    fleet = Fleet(workers=2)
    fleet.run([square_job(i) for i in range(4)])
    uids = fleet.worker_uids()
    assert len(uids) == 4  # a program sandbox and a judge sandbox per worker
    most = IDLE_PROCESSES_PER_WORKER * 2
    deadline = time.monotonic() + 60  # finished runs may take a while to exit on a loaded machine
    while len(processes_of(uids)) > most and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 3 * 2 <= len(processes_of(uids)) <= most  # each server (the zygote's parent too), at most one spare each
    fleet.close()
    deadline = time.monotonic() + 60
    while processes_of(uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(uids) == []


def test_concurrent_callers_get_their_own_results():
    """Two threads share one fleet: each gets exactly what it would get alone (no mixed batches)."""
    right = [square_job(i) for i in range(30)]
    wrong = [square_job(i, wrong=True) for i in range(30)]
    out: dict[str, list[RunResult]] = {}
    with Fleet(workers=2, cache=False) as fleet:
        sequential = {"right": fleet.run(right), "wrong": fleet.run(wrong)}
        threads = [threading.Thread(target=lambda k=k, jobs=jobs: out.__setitem__(k, fleet.run(jobs)))
                   for k, jobs in (("right", right), ("wrong", wrong))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for k in ("right", "wrong"):
        assert [r.status for r in out[k]] == [r.status for r in sequential[k]]
    assert all(r.passed for r in out["right"]) and not any(r.passed for r in out["wrong"])


def test_a_job_running_in_another_call_is_not_run_again():
    """A call that asks for a job another thread's call is running waits for that run's verdict."""
    slow = Job("import time\ntime.sleep(1.0)\ndef f():\n    return 1\n", AssertTests("assert f() == 1\n"), LIMITS)
    out: dict[str, RunResult] = {}
    with Fleet(workers=2) as fleet:
        first = threading.Thread(target=lambda: out.__setitem__("first", fleet.run([slow])[0]))
        first.start()
        while fleet.stats.jobs < 1:  # the first call has taken the job
            time.sleep(0.01)
        second = fleet.run([slow, square_job(5)])
        first.join()
        assert fleet.stats.runs == 2  # the slow job once, square_job(5) once
    assert out["first"].passed and not out["first"].cached
    assert second[0].passed and second[0].cached and second[1].passed


def test_an_exception_around_one_job_is_that_jobs_error(monkeypatch):
    real_run = sandbox.SandboxWorker.run

    def flaky(self, job):
        if "boom" in job.program:
            raise KeyError("simulated bug")
        return real_run(self, job)

    monkeypatch.setattr(sandbox.SandboxWorker, "run", flaky)
    unkeyable = Job("x = '\ud800'", AssertTests("assert True"), LIMITS)  # a lone surrogate
    with Fleet(workers=2, cache=False) as fleet:
        results = fleet.run([square_job(1), Job("boom = 1", AssertTests(""), LIMITS), unkeyable, square_job(2)])
    assert [r.status for r in results][::3] == ["pass", "pass"]
    assert results[1].status == "error" and "KeyError" in results[1].stderr
    assert results[2].status == "error" and not results[2].passed


def test_bad_limits_are_rejected():
    for bad in (dict(timeout_s=float("inf")), dict(timeout_s=float("nan")), dict(timeout_s=0), dict(timeout_s=1e999),
                dict(memory_mb=0), dict(memory_mb=1.5), dict(max_processes=-1)):
        with pytest.raises(ValueError):
            Limits(**bad)
    with pytest.raises(ValueError):
        Fleet(workers=-1)


def test_timeouts_are_not_cached_and_can_be_retried(tmp_path):
    slow = Job("while True:\n    pass\n", AssertTests("assert True"), Limits(timeout_s=0.5))
    path = tmp_path / "runs.jsonl"
    with Fleet(workers=1, cache_path=path, timeout_retries=1) as fleet:
        first = fleet.run([slow, slow, square_job(1)])
        assert [r.status for r in first] == ["timeout", "timeout", "pass"]
        assert fleet.stats.runs == 2 and fleet.stats.retries == 1  # run once, retried once, the twin deduplicated
        again = fleet.run([slow])
        assert again[0].status == "timeout" and not again[0].cached and fleet.stats.runs == 3
    assert "timeout" not in path.read_text()


def test_host_descriptors_above_1023():
    """The host may hold many open files (select() would fail past 1023)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1200:
        pytest.skip("cannot open 1,100 descriptors here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with Fleet(workers=1, cache=False) as fleet:
            results = fleet.run([square_job(3), square_job(3, wrong=True),
                                 Job("print(2)", IOTests((IOCase("", "2"),)), LIMITS)])
        assert [r.status for r in results] == ["pass", "fail", "pass"]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ---- round 2 of the audit (issue #24): infrastructure failures, the cache bound, close, hangs -------

def test_a_program_cannot_pass_for_an_infrastructure_failure():
    """Writing `sandbox ...` to stderr and failing is a verdict like any other: cached, not re-run until a pass."""
    coin = Job("import sys\nprint('sandbox worker failed twice', file=sys.stderr)\nsys.exit(1)\n",
               AssertTests("assert True"), LIMITS)
    with Fleet(workers=1) as fleet:
        first, = fleet.run([coin])
        again, = fleet.run([coin])
    assert first.status == "error" and not first.infrastructure
    assert again.cached and fleet.stats.runs == 1


def test_the_cache_keeps_only_the_most_recently_used_results(tmp_path):
    path = tmp_path / "runs.jsonl"
    with Fleet(workers=1, cache_path=path, max_cache_entries=2) as fleet:
        fleet.run([square_job(1), square_job(2)])
        assert fleet.run([square_job(1)])[0].cached  # now 2 is the least recently used
        fleet.run([square_job(3)])
        assert len(fleet._cache) == 2 and fleet.stats.runs == 3
        assert not fleet.run([square_job(2)])[0].cached and fleet.stats.runs == 4
    with Fleet(workers=1, cache_path=path, max_cache_entries=1) as reloaded:
        assert list(reloaded._cache) == [reloaded._key(square_job(2))]  # the file's last line
    with pytest.raises(ValueError):
        Fleet(max_cache_entries=0)


def _run_in_thread(fleet: Fleet, jobs: list[Job]) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.extend(fleet.run(jobs)), daemon=True)
    thread.start()
    return thread, out


def _wait_until_running(fleet: Fleet) -> None:
    deadline = time.monotonic() + 120
    while not fleet._deadlines and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fleet._deadlines, "the job never started"
    time.sleep(0.3)  # into the program's sleep


SLEEPER = Job("import time\ntime.sleep(600)\n", AssertTests("assert True"), Limits(timeout_s=120.0))


def test_close_during_a_run_leaves_no_worker_and_does_not_retry():
    fleet = Fleet(workers=1, cache=False)
    thread, out = _run_in_thread(fleet, [SLEEPER, square_job(1)])
    _wait_until_running(fleet)
    fleet.close()
    thread.join(60)
    assert not thread.is_alive()
    assert [r.status for r in out] == ["error", "error"] and all(r.infrastructure for r in out), out
    assert "closed" in out[0].stderr and fleet.stats.retries == 0
    assert fleet._workers == [None]
    assert fleet.run([square_job(2)])[0].status == "error"  # a closed fleet starts nothing


def test_the_watchdog_kills_a_worker_past_its_jobs_deadline(monkeypatch):
    """A job that outlives its limits (here a deadline shortened to 1 s) is that job's error, not a hang."""
    from reward import fleet as fleet_module

    monkeypatch.setattr(fleet_module, "job_deadline_s", lambda job: 1.0 if job is SLEEPER else 600.0)
    with Fleet(workers=1, cache=False) as fleet:
        thread, out = _run_in_thread(fleet, [SLEEPER])
        thread.join(60)
        assert not thread.is_alive()
        assert out[0].status == "error" and out[0].infrastructure and "watchdog" in out[0].stderr, out
        assert fleet.stats.watchdog_kills == 1 and fleet.stats.retries == 0
        assert fleet.run([square_job(4)])[0].passed


def test_a_partial_frame_on_the_host_socket_is_a_timeout_not_a_hang():
    """An `inprocess` program writes two bytes of a frame header to every descriptor and sleeps."""
    program = ("import os, time\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'\\x00\\x00')\n"
               "    except OSError:\n        pass\ntime.sleep(600)\n")
    job = Job(program, AssertTests("assert True", "inprocess"), Limits(timeout_s=1.0))
    with Fleet(workers=1, cache=False) as fleet:
        thread, out = _run_in_thread(fleet, [job])
        thread.join(60)
        assert not thread.is_alive(), "Fleet.run hung on the host socket"
        assert out[0].status == "timeout", out
        assert fleet.stats.worker_restarts == 0 and fleet.run([square_job(5)])[0].passed


def test_a_job_over_the_message_limit_is_refused_up_front():
    big = Job("x = '" + "a" * (17 << 20) + "'\ndef sq(v):\n    return v * v\n", AssertTests("assert sq(3) == 9"), LIMITS)
    with Fleet(workers=1, cache=False) as fleet:
        result, = fleet.run([big])
        assert result.status == "error" and "16 MiB" in result.stderr and not result.infrastructure, result
        assert fleet.stats.worker_restarts == 0 and fleet.stats.retries == 0
