"""The verification fleet: sandbox workers over the machine's cores behind one thread-safe call.

`Fleet.run(jobs)` takes many (program, tests, limits) jobs and returns their
results in order; several threads may call it at once. Identical jobs (same
content address, `Job.key()`) are run once: repeats within a batch and across
batches come from the cache, which can also persist on disk so a rerun of a long
build resumes instead of starting over (timeouts are never cached: load can cause
them). A worker that crashes or hangs is replaced and its job retried once, then
reported as `error`; any other failure around one job is that job's `error`:
nothing hangs, no job is silently dropped, and no batch fails as a whole.

`grain_dataset(jobs)` exposes the same work as a Grain dataset whose worker
processes each own a sandbox, for pipelines that feed rewards through Grain.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import queue
import threading
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from reward.sandbox import Isolation, Job, RunResult, SandboxWorker, WorkerDied, resolve_isolation


@dataclasses.dataclass
class FleetStats:
    """Counters since the fleet started: what ran, what the cache saved, what broke."""

    jobs: int = 0
    runs: int = 0
    cache_hits: int = 0
    retries: int = 0
    worker_restarts: int = 0


class Fleet:
    """A pool of sandbox workers with a content-addressed result cache; `run` is thread-safe.

    Args:
      workers: number of sandbox workers (default: the machine's cores).
      cache: keep results by content address so identical runs happen once.
      cache_path: optional JSONL file that persists the cache across processes.
      isolation: "auto" (bubblewrap, else rlimits with a loud warning), "bwrap" or "rlimits".
      timeout_retries: how many times a run that timed out is run again before its timeout stands
        (`data build` uses 1: a timeout caused by machine load should not drop a candidate).

    A timeout is never cached across batches nor written to `cache_path`: it may
    come from machine load rather than the program. Several threads may call
    `run` at once: each call takes idle workers from one shared pool, so no two
    calls ever drive the same worker, and each gets exactly its own results.
    """

    def __init__(self, workers: int | None = None, cache: bool = True,
                 cache_path: str | os.PathLike | None = None, isolation: Isolation = "auto",
                 timeout_retries: int = 0):
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        if timeout_retries < 0:
            raise ValueError(f"timeout_retries must be >= 0, got {timeout_retries}")
        self.num_workers = workers or os.cpu_count() or 1
        self.isolation = resolve_isolation(isolation)
        self.cache_enabled = cache
        self.timeout_retries = timeout_retries
        self.stats = FleetStats()
        self._cache: dict[str, RunResult] = {}
        self._cache_file = None
        if cache and cache_path is not None:
            self._cache.update(_read_cache(Path(cache_path)))
            self._cache_file = open(cache_path, "a", encoding="utf-8")
        self._workers: list[SandboxWorker | None] = [None] * self.num_workers
        self._idle: queue.Queue[int] = queue.Queue()
        for slot in range(self.num_workers):
            self._idle.put(slot)
        self._lock = threading.Lock()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every sandbox worker and flush the cache file."""
        with self._lock:
            for i, worker in enumerate(self._workers):
                if worker is not None:
                    worker.close()
                    self._workers[i] = None
            if self._cache_file is not None:
                self._cache_file.close()
                self._cache_file = None

    def run(self, jobs: Sequence[Job], progress: bool | str = False) -> list[RunResult]:
        """Run `jobs` in parallel and return their results in the same order.

        Never raises for one bad job: whatever goes wrong around a job becomes
        that job's `error` result, with the reason in `stderr`.

        Args:
          jobs: the runs to make.
          progress: show a progress bar (a string is used as its label).
        """
        results: list[RunResult | None] = [None] * len(jobs)
        todo: dict[str, list[int]] = {}
        with self._lock:
            for i, job in enumerate(jobs):
                try:
                    key = job.key()
                except Exception as e:  # noqa: BLE001 - a malformed job fails alone
                    results[i] = _error(f"sandbox could not take the job: {type(e).__name__}: {e}")
                    continue
                hit = self._cache.get(key) if self.cache_enabled else None
                if hit is not None:
                    results[i] = dataclasses.replace(hit, cached=True)
                    self.stats.cache_hits += 1
                elif self.cache_enabled and key in todo:
                    todo[key].append(i)
                    self.stats.cache_hits += 1
                else:
                    todo.setdefault(key if self.cache_enabled else f"{key}#{i}", []).append(i)
            self.stats.jobs += len(jobs)
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
        for t in threads:
            t.join()
        bar.close()
        for key, indices in todo.items():
            result = done.get(key) or _error("sandbox lost the job")
            for j, i in enumerate(indices):
                results[i] = result if j == 0 else dataclasses.replace(result, cached=True)
        return results  # type: ignore[return-value]

    def _run_job(self, slot: int, job: Job) -> RunResult:
        """One job on worker `slot`: timeouts retried as configured, any exception an `error` result."""
        try:
            result = self._run_on(slot, job)
            for _ in range(self.timeout_retries):
                if result.status != "timeout":
                    break
                self._count("retries")
                result = self._run_on(slot, job)
            return result
        except Exception as e:  # noqa: BLE001 - one job's failure must not take the batch down
            return _error(f"sandbox error: {type(e).__name__}: {e}")

    def _run_on(self, slot: int, job: Job) -> RunResult:
        """Run on worker `slot`, replacing a dead worker and retrying the job once."""
        for attempt in range(2):
            try:
                worker = self._workers[slot]
                if worker is None or not worker.alive():
                    if worker is not None:
                        worker.close()
                        self._count("worker_restarts")
                    worker = self._workers[slot] = SandboxWorker(self.isolation)
                return worker.run(job)
            except (WorkerDied, RuntimeError, OSError) as e:
                error = e
                if self._workers[slot] is not None:
                    self._workers[slot].close()
                    self._workers[slot] = None
                    self._count("worker_restarts")
                if attempt == 0:
                    self._count("retries")
        return _error(f"sandbox worker failed twice: {error}")

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _remember(self, key: str, result: RunResult) -> None:
        self._cache[key] = result
        if self._cache_file is not None:
            self._cache_file.write(json.dumps({"key": key, **result.to_json()}) + "\n")
            self._cache_file.flush()

    def worker_uids(self) -> list[int]:
        """Real uids of the live sandboxes (two per worker; root only; for tests and monitoring)."""
        return [uid for w in self._workers if w is not None and w.alive() for uid in w.uids]


def _error(message: str) -> RunResult:
    return RunResult(passed=False, status="error", duration_s=0.0, stderr=message)


def _cacheable(result: RunResult) -> bool:
    """A verdict of the program: not a failure of the sandbox itself, and not a timeout (load-dependent)."""
    return not _infrastructure_failure(result) and result.status != "timeout"


def _infrastructure_failure(result: RunResult) -> bool:
    """A failure of the sandbox itself, not of the program: never cached."""
    return result.status == "error" and result.stderr.startswith("sandbox ")


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
                cache[key] = result
    return cache


# ---- Grain -----------------------------------------------------------------------------

_process_worker: SandboxWorker | None = None


@atexit.register
def _close_process_worker() -> None:
    """A Grain worker process's sandbox ends with the process (its cgroups are removed)."""
    if _process_worker is not None:
        _process_worker.close()


def _run_in_process_sandbox(job: Job, isolation: str) -> RunResult:
    """Run `job` in this process's own sandbox worker, started on first use."""
    global _process_worker
    for attempt in range(2):
        try:
            if _process_worker is None or not _process_worker.alive():
                _process_worker = SandboxWorker(isolation)  # type: ignore[arg-type]
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

    def __init__(self, isolation: str):
        self.isolation = isolation

    def __call__(self, job: Job) -> RunResult:
        return _run_in_process_sandbox(job, self.isolation)


def grain_dataset(jobs: Sequence[Job], workers: int | None = None, isolation: Isolation = "auto"):
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
    ds = grain.MapDataset.source(list(jobs)).map(_SandboxRun(mode))
    n = workers or os.cpu_count() or 1
    return ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=n))
