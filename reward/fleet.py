"""The verification fleet: sandbox workers over the machine's cores behind one thread-safe call.

`Fleet.run(jobs)` takes many (program, tests, limits) jobs and returns their
results in order; several threads may call it at once. Identical jobs (same
content address, `Job.key()`) are run once: repeats within a batch and across
batches come from the cache, which can also persist on disk so a rerun of a long
build resumes instead of starting over (timeouts are never cached: load can cause
them); the cache keeps the `max_cache_entries` most recently used results. A
worker that crashes or hangs is replaced and its job retried once, then reported
as `error`; any other failure around one job is that job's `error`: nothing
hangs (a watchdog kills a worker that outlives its job's limits; that job is not
retried), no job is silently dropped, and no batch fails as a whole. After
`close()` no worker starts: jobs still running or waiting end as `error`.

`grain_dataset(jobs)` exposes the same work as a Grain dataset whose worker
processes each own a sandbox, for pipelines that feed rewards through Grain.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from tqdm import tqdm

from reward.sandbox import (WATCHDOG_MARGIN_S, Isolation, Job, LibraryEnv, RunResult, SandboxWorker, WorkerDied,
                            job_deadline_s, library_env, preload_for, resolve_isolation)

MAX_CACHE_ENTRIES = 200_000  # at most ~4 KiB each (two output excerpts): under 1 GiB
WATCHDOG_POLL_S = 0.5


@dataclasses.dataclass
class FleetStats:
    """Counters since the fleet started: what ran, what the cache saved, what broke."""

    jobs: int = 0
    runs: int = 0
    cache_hits: int = 0
    retries: int = 0
    worker_restarts: int = 0
    watchdog_kills: int = 0
    seeded: int = 0


class Fleet:
    """A pool of sandbox workers with a content-addressed result cache; `run` is thread-safe.

    Args:
      workers: number of sandbox workers (default: the machine's cores).
      cache: keep results by content address so identical runs happen once.
      cache_path: optional JSONL file that persists the cache across processes.
      isolation: "auto" (bubblewrap, else rlimits with a loud warning), "bwrap" or "rlimits".
      timeout_retries: how many times a run that timed out is run again before its timeout stands
        (`data build` uses 1: a timeout caused by machine load should not drop a candidate).
      max_cache_entries: how many results the cache keeps (the least recently used go first).
      libraries: the packages runs may import (default: this process's environment, `library_env()`);
        part of every cache key, so a verdict is reused only under the same environment. Workers
        preload only the modules of its preload list that the jobs so far import (run processes what
        the programs import, test processes what the tests import): a fleet of function tasks pays
        nothing for them, and its workers are replaced once when a batch first needs more.

    A timeout is never cached across batches nor written to `cache_path`: it may
    come from machine load rather than the program. Several threads may call
    `run` at once: each call takes idle workers from one shared pool, so no two
    calls ever drive the same worker, and each gets exactly its own results.
    """

    def __init__(self, workers: int | None = None, cache: bool = True,
                 cache_path: str | os.PathLike | None = None, isolation: Isolation = "auto",
                 timeout_retries: int = 0, max_cache_entries: int = MAX_CACHE_ENTRIES,
                 libraries: LibraryEnv | None = None):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        if timeout_retries < 0:
            raise ValueError(f"timeout_retries must be >= 0, got {timeout_retries}")
        if isinstance(max_cache_entries, bool) or not isinstance(max_cache_entries, int) or max_cache_entries < 1:
            raise ValueError(f"max_cache_entries must be a positive integer, got {max_cache_entries!r}")
        self.num_workers = workers or os.cpu_count() or 1
        self.isolation = resolve_isolation(isolation)
        self.libraries = library_env() if libraries is None else libraries
        self._preload: tuple[tuple[str, ...], ...] = ((), ())  # what new workers' run and test processes preload:
        # what the jobs so far imported there
        self.cache_enabled = cache
        self.timeout_retries = timeout_retries
        self.stats = FleetStats()
        self.max_cache_entries = max_cache_entries
        self._cache: collections.OrderedDict[str, RunResult] = collections.OrderedDict()
        self._cache_file = None
        if cache and cache_path is not None:
            self._cache.update(_read_cache(Path(cache_path)))
            self._trim_cache()
            self._cache_file = open(cache_path, "a", encoding="utf-8")
        self._workers: list[SandboxWorker | None] = [None] * self.num_workers
        self._idle: queue.Queue[int] = queue.Queue()
        for slot in range(self.num_workers):
            self._idle.put(slot)
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._closed = False
        self._deadlines: dict[int, float] = {}  # slot -> when its current job's worker is killed
        self._watchdog_fired: set[int] = set()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every sandbox worker and flush the cache file; a `run` in progress starts no new worker."""
        with self._lock:
            self._closed = True
            for i, worker in enumerate(self._workers):
                if worker is None:
                    continue
                if i in self._deadlines:
                    worker.kill()  # the thread running its job sees it die and closes it
                else:
                    worker.close()
                    self._workers[i] = None
            if self._cache_file is not None:
                self._cache_file.close()
                self._cache_file = None

    def seed(self, verdicts: Iterable[tuple[Job, RunResult]]) -> int:
        """Put verdicts known without running (a task's solution passes its tests) into the cache.

        Those jobs are then answered from the cache like any repeat. Only cacheable
        verdicts are taken (no timeouts, no sandbox failures), an entry already cached
        is kept, and nothing seeded is written to `cache_path`. Returns how many were added.
        """
        added = 0
        with self._lock:
            if not self.cache_enabled:
                return 0
            for job, result in verdicts:
                key = self._key(job)
                if _cacheable(result) and key not in self._cache:
                    self._cache[key] = result
                    added += 1
            self._trim_cache()
            self.stats.seeded += added
        return added

    def run(self, jobs: Sequence[Job], progress: bool | str = False) -> list[RunResult]:
        """Run `jobs` in parallel and return their results in the same order.

        A job identical to one another call is running waits for that run's result.

        Never raises for one bad job: whatever goes wrong around a job becomes
        that job's `error` result, with the reason in `stderr`.

        Args:
          jobs: the runs to make.
          progress: show a progress bar (a string is used as its label).
        """
        results: list[RunResult | None] = [None] * len(jobs)
        todo: dict[str, list[int]] = {}
        elsewhere: dict[str, tuple[_Running, list[int]]] = {}  # running in another call: its result
        with self._lock:
            for i, job in enumerate(jobs):
                try:
                    key = self._key(job)
                except Exception as e:  # noqa: BLE001 - a malformed job fails alone
                    results[i] = _error(f"sandbox could not take the job: {type(e).__name__}: {e}")
                    continue
                hit = self._cache.get(key) if self.cache_enabled else None
                if hit is not None:
                    self._cache.move_to_end(key)
                    results[i] = dataclasses.replace(hit, cached=True)
                    self.stats.cache_hits += 1
                elif self.cache_enabled and key in todo:
                    todo[key].append(i)
                    self.stats.cache_hits += 1
                elif self.cache_enabled and key in self._running:
                    elsewhere.setdefault(key, (self._running[key], []))[1].append(i)
                    self.stats.cache_hits += 1
                else:
                    todo.setdefault(key if self.cache_enabled else f"{key}#{i}", []).append(i)
            if self.cache_enabled:
                for key in todo:
                    self._running[key] = _Running()
            self.stats.jobs += len(jobs)
            needed = preload_for((jobs[indices[0]] for indices in todo.values()), self.libraries.preload)
            self._preload = tuple(tuple(m for m in self.libraries.preload if m in now or m in before)
                                  for now, before in zip(needed, self._preload))
        try:
            self._serve(jobs, todo, results, progress)
        finally:  # our runs end before we wait for another call's: no two calls wait on each other
            with self._lock:
                for key, indices in todo.items():
                    running = self._running.pop(key, None)
                    if running is not None:
                        running.finish(results[indices[0]] or _error("sandbox lost the job"))
        for running, indices in elsewhere.values():
            result = dataclasses.replace(running.wait(), cached=True)
            for i in indices:
                results[i] = result
        return results  # type: ignore[return-value]

    def _serve(self, jobs: Sequence[Job], todo: dict[str, list[int]], results: list[RunResult | None],
               progress: bool | str) -> None:
        """Run each job of `todo` once on the idle workers and fill `results` at every index of its key."""
        work: queue.Queue = queue.Queue()
        for key, indices in todo.items():
            work.put((key, jobs[indices[0]]))
        bar = tqdm(total=len(todo), desc=progress if isinstance(progress, str) else "test runs",
                   disable=not progress or not todo, unit="run", leave=False)
        done: dict[str, RunResult] = {}

        def serve() -> None:
            slot = self._idle.get()
            try:
                while True:
                    try:
                        key, job = work.get_nowait()
                    except queue.Empty:
                        return
                    result = self._run_job(slot, job)
                    with self._lock:
                        done[key] = result
                        self.stats.runs += 1
                        if self.cache_enabled and _cacheable(result):
                            self._remember(key, result)
                        bar.update(1)
            finally:
                self._idle.put(slot)

        threads = [threading.Thread(target=serve, daemon=True) for _ in range(min(self.num_workers, len(todo)))]
        for t in threads:
            t.start()
        while threads:
            threads[0].join(WATCHDOG_POLL_S)
            threads = [t for t in threads if t.is_alive()]
            self._watch()
        bar.close()
        for key, indices in todo.items():
            result = done.get(key) or _error("sandbox lost the job")
            for j, i in enumerate(indices):
                results[i] = result if j == 0 else dataclasses.replace(result, cached=True)

    def _run_job(self, slot: int, job: Job) -> RunResult:
        """One job on worker `slot`: timeouts retried as configured, any exception an `error` result."""
        try:
            result = self._run_on(slot, job)
            for _ in range(self.timeout_retries if job.retry_timeout else 0):
                if result.status != "timeout":
                    break
                self._count("retries")
                result = self._run_on(slot, job)
            return result
        except Exception as e:  # noqa: BLE001 - one job's failure must not take the batch down
            return _error(f"sandbox error: {type(e).__name__}: {e}")

    def _run_on(self, slot: int, job: Job) -> RunResult:
        """Run on worker `slot`, replacing a dead worker and retrying the job once.

        No retry once the fleet is closed or the watchdog killed the worker: the job ends as `error`.
        """
        for attempt in range(2):
            error = None
            try:
                worker = self._start_worker(slot)
                if worker is None:
                    return _error("sandbox fleet closed before the job ran")
                with self._lock:
                    self._deadlines[slot] = time.monotonic() + job_deadline_s(job)
                    self._watchdog_fired.discard(slot)
                try:
                    result = worker.run(job)
                finally:
                    with self._lock:
                        self._deadlines.pop(slot, None)
            except (WorkerDied, RuntimeError, OSError) as e:
                error = e
            with self._lock:
                fired, closed = slot in self._watchdog_fired, self._closed
                self._watchdog_fired.discard(slot)
            if error is not None or fired or closed:  # close() and the watchdog only kill a busy worker
                self._drop(slot)
            if fired:
                return _error(f"sandbox watchdog: the job ran past its limits plus {WATCHDOG_MARGIN_S:g} s; "
                              "its worker was killed")
            if closed:
                return _error("sandbox fleet closed during the job")
            if error is None:
                return result
            if attempt == 0:
                self._count("retries")
        return _error(f"sandbox worker failed twice: {error}")

    def _drop(self, slot: int) -> None:
        """Close worker `slot` (dead or killed) so that the next job starts a new one."""
        worker = self._workers[slot]
        if worker is not None:
            worker.close()
            self._workers[slot] = None
            self._count("worker_restarts")

    def _start_worker(self, slot: int) -> SandboxWorker | None:
        """Worker `slot`, started if it is not running; None once the fleet is closed."""
        worker = self._workers[slot]
        program, tests = self._preload
        if worker is not None and worker.alive():
            if (worker.libraries.preload, worker.judge_preload) == (program, tests):
                return worker
            worker.close()  # it preloads less than the jobs now need: replaced, not a restart
            self._workers[slot] = None
        self._drop(slot)
        if self._closed:
            return None
        worker = SandboxWorker(self.isolation, libraries=dataclasses.replace(self.libraries, preload=program),
                               judge_preload=tests)
        with self._lock:
            if not self._closed:
                self._workers[slot] = worker
                return worker
        worker.close()  # close() ran while it started
        return None

    def _key(self, job: Job) -> str:
        """The job's content address under this fleet's library environment."""
        return hashlib.sha256(f"{job.key()}:{self.libraries.digest}".encode()).hexdigest()

    def _watch(self) -> None:
        """Kill the worker of every job past its deadline (`job_deadline_s`): nothing a program does hangs `run`."""
        now = time.monotonic()
        with self._lock:
            for slot, deadline in list(self._deadlines.items()):
                worker = self._workers[slot]
                if now > deadline and worker is not None:
                    self._watchdog_fired.add(slot)
                    del self._deadlines[slot]
                    self.stats.watchdog_kills += 1
                    worker.kill()

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _remember(self, key: str, result: RunResult) -> None:
        self._cache[key] = result
        self._trim_cache()
        if self._cache_file is not None:
            self._cache_file.write(json.dumps({"key": key, **result.to_json()}) + "\n")
            self._cache_file.flush()

    def _trim_cache(self) -> None:
        while len(self._cache) > self.max_cache_entries:
            self._cache.popitem(last=False)

    def worker_uids(self) -> list[int]:
        """Real uids of the live sandboxes (two per worker; root only; for tests and monitoring)."""
        return [uid for w in self._workers if w is not None and w.alive() for uid in w.uids]


class _Running:
    """A job one call of `Fleet.run` is running, whose result other calls wait for."""

    def __init__(self):
        self._done = threading.Event()
        self._result: RunResult | None = None

    def finish(self, result: RunResult) -> None:
        self._result = result
        self._done.set()

    def wait(self) -> RunResult:
        self._done.wait()
        return self._result  # type: ignore[return-value]


def _error(message: str) -> RunResult:
    """A failure of the sandbox around a job (not a verdict on its program)."""
    return RunResult(passed=False, status="error", duration_s=0.0, stderr=message, infrastructure=True)


def _cacheable(result: RunResult) -> bool:
    """A verdict of the program: not a failure of the sandbox itself, and not a timeout (load-dependent)."""
    return not result.infrastructure and result.status != "timeout"


def _read_cache(path: Path) -> dict[str, RunResult]:
    """Load a persisted cache, skipping a torn last line left by a crash."""
    cache: dict[str, RunResult] = {}
    if not path.exists():
        return cache
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                obj = json.loads(line)
                key = obj.pop("key")
                obj["cached"] = False
                result = RunResult(**obj)
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue
            if _cacheable(result):  # files written before timeouts were kept out may hold some
                cache.pop(key, None)  # in the order of last use, for the cache bound
                cache[key] = result
    return cache


# ---- Grain -----------------------------------------------------------------------------

_process_worker: SandboxWorker | None = None


@atexit.register
def _close_process_worker() -> None:
    """A Grain worker process's sandbox ends with the process (its cgroups are removed)."""
    if _process_worker is not None:
        _process_worker.close()


def _run_in_process_sandbox(job: Job, isolation: str, libraries: LibraryEnv) -> RunResult:
    """Run `job` in this process's own sandbox worker, started on first use."""
    global _process_worker
    for attempt in range(2):
        try:
            if _process_worker is None or not _process_worker.alive():
                _process_worker = SandboxWorker(isolation, libraries=libraries)  # type: ignore[arg-type]
            return _process_worker.run(job)
        except (WorkerDied, RuntimeError, OSError) as e:
            error = e
            if _process_worker is not None:
                _process_worker.close()
            _process_worker = None
        except Exception as e:  # noqa: BLE001 - a bad job fails alone
            return _error(f"sandbox error: {type(e).__name__}: {e}")
    return _error(f"sandbox worker failed twice: {error}")


class _SandboxRun:
    """Picklable map function for Grain workers."""

    def __init__(self, isolation: str, libraries: LibraryEnv):
        self.isolation = isolation
        self.libraries = libraries

    def __call__(self, job: Job) -> RunResult:
        return _run_in_process_sandbox(job, self.isolation, self.libraries)


def grain_dataset(jobs: Sequence[Job], workers: int | None = None, isolation: Isolation = "auto",
                  libraries: LibraryEnv | None = None):
    """A Grain IterDataset of `RunResult`s, in job order, computed by worker processes.

    Each Grain worker process owns one sandbox server. Grain's multiprocessing
    reads absl flags, which only the application may parse (a library that marks
    them parsed changes global state under its caller): call
    `absl.flags.FLAGS(sys.argv[:1])` in your program's entry point first.

    Raises:
      RuntimeError: absl flags are not parsed yet.
    """
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():
        raise RuntimeError("grain_dataset needs absl flags parsed by the application: "
                           "call absl.flags.FLAGS(sys.argv[:1]) in its entry point first")
    mode = resolve_isolation(isolation)
    ds = grain.MapDataset.source(list(jobs)).map(_SandboxRun(mode, library_env() if libraries is None else libraries))
    n = workers or os.cpu_count() or 1
    return ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=n))
