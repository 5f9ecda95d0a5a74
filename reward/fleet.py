"""The verification fleet: sandbox workers over the machine's cores behind one call.

`Fleet.run(jobs)` takes many (program, tests, limits) jobs and returns their
results in order. Identical jobs (same content address, `Job.key()`) are run
once: repeats within a batch and across batches come from the cache, which can
also persist on disk so a rerun of a long build resumes instead of starting
over. A worker that crashes or hangs is replaced and its job retried once, then
reported as `error`: nothing hangs and no job is silently dropped.

`grain_dataset(jobs)` exposes the same work as a Grain dataset whose worker
processes each own a sandbox, for pipelines that feed rewards through Grain.
"""

from __future__ import annotations

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
    """A pool of sandbox workers with a content-addressed result cache.

    Args:
      workers: number of sandbox workers (default: the machine's cores).
      cache: keep results by content address so identical runs happen once.
      cache_path: optional JSONL file that persists the cache across processes.
      isolation: "auto" (bubblewrap, else rlimits with a loud warning), "bwrap" or "rlimits".
    """

    def __init__(self, workers: int | None = None, cache: bool = True,
                 cache_path: str | os.PathLike | None = None, isolation: Isolation = "auto"):
        self.num_workers = workers or os.cpu_count() or 1
        if self.num_workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.isolation = resolve_isolation(isolation)
        self.cache_enabled = cache
        self.stats = FleetStats()
        self._cache: dict[str, RunResult] = {}
        self._cache_file = None
        if cache and cache_path is not None:
            self._cache.update(_read_cache(Path(cache_path)))
            self._cache_file = open(cache_path, "a", encoding="utf-8")
        self._workers: list[SandboxWorker | None] = [None] * self.num_workers
        self._lock = threading.Lock()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every sandbox worker and flush the cache file."""
        for i, worker in enumerate(self._workers):
            if worker is not None:
                worker.close()
                self._workers[i] = None
        if self._cache_file is not None:
            self._cache_file.close()
            self._cache_file = None

    def run(self, jobs: Sequence[Job], progress: bool | str = False) -> list[RunResult]:
        """Run `jobs` in parallel and return their results in the same order.

        Args:
          jobs: the runs to make.
          progress: show a progress bar (a string is used as its label).
        """
        keys = [job.key() for job in jobs]
        results: list[RunResult | None] = [None] * len(jobs)
        todo: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
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

        def serve(slot: int) -> None:
            while True:
                try:
                    key, job = work.get_nowait()
                except queue.Empty:
                    return
                result = self._run_on(slot, job)
                with self._lock:
                    done[key] = result
                    self.stats.runs += 1
                    if self.cache_enabled and not _infrastructure_failure(result):
                        self._remember(key, result)
                    bar.update(1)

        threads = [threading.Thread(target=serve, args=(slot,), daemon=True)
                   for slot in range(min(self.num_workers, len(todo)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bar.close()
        for key, indices in todo.items():
            for j, i in enumerate(indices):
                results[i] = done[key] if j == 0 else dataclasses.replace(done[key], cached=True)
        return results  # type: ignore[return-value]

    def _run_on(self, slot: int, job: Job) -> RunResult:
        """Run on worker `slot`, replacing a dead worker and retrying the job once."""
        for attempt in range(2):
            try:
                worker = self._workers[slot]
                if worker is None or not worker.alive():
                    if worker is not None:
                        worker.close()
                        self.stats.worker_restarts += 1
                    worker = self._workers[slot] = SandboxWorker(self.isolation)
                return worker.run(job)
            except (WorkerDied, RuntimeError, OSError) as e:
                error = e
                if self._workers[slot] is not None:
                    self._workers[slot].close()
                    self._workers[slot] = None
                    self.stats.worker_restarts += 1
                if attempt == 0:
                    self.stats.retries += 1
        return RunResult(passed=False, status="error", duration_s=0.0,
                         stderr=f"sandbox worker failed twice: {error}")

    def _remember(self, key: str, result: RunResult) -> None:
        self._cache[key] = result
        if self._cache_file is not None:
            self._cache_file.write(json.dumps({"key": key, **result.to_json()}) + "\n")
            self._cache_file.flush()

    def worker_uids(self) -> list[int]:
        """Real uids of the live sandbox workers (root only; for tests and monitoring)."""
        return [w.uid for w in self._workers if w is not None and w.alive() and w.uid is not None]


def _infrastructure_failure(result: RunResult) -> bool:
    """A failure of the sandbox itself, not of the program: never cached."""
    return result.status == "error" and result.stderr.startswith("sandbox ")


def _read_cache(path: Path) -> dict[str, RunResult]:
    """Load a persisted cache, skipping a torn last line left by a crash."""
    cache: dict[str, RunResult] = {}
    if not path.exists():
        return cache
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                obj = json.loads(line)
                key = obj.pop("key")
                obj["cached"] = False
                cache[key] = RunResult(**obj)
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return cache


# ---- Grain -----------------------------------------------------------------------------

_process_worker: SandboxWorker | None = None


def _run_in_process_sandbox(job: Job, isolation: str) -> RunResult:
    """Run `job` in this process's own sandbox worker, started on first use."""
    global _process_worker
    for attempt in range(2):
        if _process_worker is None or not _process_worker.alive():
            _process_worker = SandboxWorker(isolation)  # type: ignore[arg-type]
        try:
            return _process_worker.run(job)
        except WorkerDied as e:
            error = e
            _process_worker = None
    return RunResult(passed=False, status="error", duration_s=0.0, stderr=f"sandbox worker failed twice: {error}")


class _SandboxRun:
    """Picklable map function for Grain workers."""

    def __init__(self, isolation: str):
        self.isolation = isolation

    def __call__(self, job: Job) -> RunResult:
        return _run_in_process_sandbox(job, self.isolation)


def grain_dataset(jobs: Sequence[Job], workers: int | None = None, isolation: Isolation = "auto"):
    """A Grain IterDataset of `RunResult`s, in job order, computed by worker processes.

    Each Grain worker process owns one sandbox server. Grain's multiprocessing
    needs absl flags parsed first; this function does that when needed.
    """
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    mode = resolve_isolation(isolation)
    ds = grain.MapDataset.source(list(jobs)).map(_SandboxRun(mode))
    n = workers or os.cpu_count() or 1
    return ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=n))
