"""The reward stage: a Grain pipeline of scorer calls on the fleet.

`RewardPipeline(pairs)` is a Grain `MapDataset` over (task, prediction) pairs,
cut into one chunk per thread, whose map is `reward.score.score_predictions` on a
chunk, run by a pool of Grain threads that share one `Fleet`: the sandbox workers are started once and persist
across steps (no process start-up per step), and the fleet's content cache serves
repeated programs. Results come back in pair order.

The threads do not call `Fleet.run` themselves: their job batches go to one
dispatcher thread, which sends whatever has arrived meanwhile as one `Fleet.run`
call, on a thread of its own, and hands each scorer thread its own results. A call
in flight never holds back the batches that arrive after it (the fleet shares its
workers between concurrent calls, and an identical job already running in another
call waits for that run), so every worker stays busy while any scorer has a run to
make: a scorer phase is often a single job, and a batch is as slow as its slowest run.

Streamed (`reward.stream`), `StreamedScoring` scores each task's group as soon as the
engine has finished it, while the engine still decodes the others: one
`RewardPipeline.score_group` call per group on a small thread pool of the step's own,
through the same dispatcher. A score depends only on its (task, prediction) and the
fleet's verdicts, not on which pairs share a scorer call, so both paths give the same
scores.

For an algorithm whose reward terms read only the unit runs, the step scores with the unit
runs alone (`verify=False`), and `DeferredVerification` makes the rest of each score's runs
(reusing the unit runs' results) while the update runs: the metrics read those full scores.

The reward terms an algorithm takes from each score row live in `jaxrl.algorithms`.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Sequence

import grain

from reward.fleet import Fleet
from reward.sandbox import Job, Limits, RunResult
from reward.schema import Prediction, Task
from reward.score import Score, score_predictions


def prediction_of(task: Task, response: str, think_opened: bool) -> Prediction:
    """The prediction a completion makes (its program is extracted from `response`; `think_opened`:
    the prompt itself opened the think block, so the response must close it)."""
    return Prediction(task.task_id, response=response, think_opened=think_opened)


class _Dispatcher:
    """Merges concurrent `run_batch` calls into single `Fleet.run` calls on one thread."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self._requests: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._calls = concurrent.futures.ThreadPoolExecutor(2 * fleet.num_workers,
                                                            thread_name_prefix="reward-dispatcher-call")
        self._thread = threading.Thread(target=self._serve, daemon=True, name="reward-dispatcher")
        self._thread.start()

    def __call__(self, jobs: Sequence[Job]) -> list[RunResult]:
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:  # every request taken is ahead of close()'s None, so it is served
            if self._closed:
                raise RuntimeError("the reward pipeline is closed")
            self._requests.put((list(jobs), done))
        return done.result()

    def _serve(self) -> None:
        while True:
            first = self._requests.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    nxt = self._requests.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._requests.put(None)
                    break
                batch.append(nxt)
            self._calls.submit(self._run, batch)

    def _run(self, batch: list[tuple[list[Job], concurrent.futures.Future]]) -> None:
        try:
            results = self.fleet.run([job for jobs, _ in batch for job in jobs])
        except Exception as e:  # noqa: BLE001 - every waiting caller gets the error
            for _, done in batch:
                done.set_exception(e)
            return
        at = 0
        for jobs, done in batch:
            done.set_result(results[at:at + len(jobs)])
            at += len(jobs)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._requests.put(None)
        self._thread.join()
        self._calls.shutdown(wait=True)


class _ScoreChunk:
    def __init__(self, run_batch: Callable[[Sequence[Job]], list[RunResult]], lam: float, epsilon: int,
                 limits: Limits, window_batch: int, verify: bool = True, done: dict[Job, RunResult] | None = None):
        self.run_batch, self.lam, self.epsilon, self.limits = run_batch, lam, epsilon, limits
        self.window_batch, self.verify, self.done = window_batch, verify, done

    def __call__(self, chunk: list[tuple[Task, Prediction]]) -> list[Score]:
        return score_predictions(chunk, self.run_batch, lam=self.lam, epsilon=self.epsilon, limits=self.limits,
                                 window_batch=self.window_batch, verify=self.verify, done=self.done)

    def with_runs(self, verify: bool, done: dict[Job, RunResult] | None) -> _ScoreChunk:
        """The same scorer with `score_predictions`' `verify` and `done`."""
        return _ScoreChunk(self.run_batch, self.lam, self.epsilon, self.limits, self.window_batch, verify, done)


class RewardPipeline:
    """Scores (task, prediction) pairs through Grain on one persistent fleet.

    Args:
        fleet: this host's sandbox fleet.
        lam, epsilon, limits: the scorer's settings.
        threads: concurrent scorer calls, each on its chunk of the pairs (default: the fleet's
            worker count).
        window_batch: most windows of one prediction per scorer round (default: twice the fleet's
            worker count); it changes the runs made, never a score.
    """

    def __init__(self, fleet: Fleet, lam: float, epsilon: int, limits: Limits, threads: int | None = None,
                 window_batch: int | None = None):
        self.fleet = fleet
        self.threads = threads or fleet.num_workers
        self._dispatcher = _Dispatcher(fleet)
        self._map = _ScoreChunk(self._dispatcher, lam, epsilon, limits, window_batch or 2 * fleet.num_workers)

    def __call__(self, pairs: Sequence[tuple[Task, Prediction]], verify: bool = True,
                 done: dict[Job, RunResult] | None = None) -> list[Score]:
        """Scores in pair order (`verify`, `done`: as `reward.score.score_predictions` takes them)."""
        if not pairs:
            return []
        chunk = -(-len(pairs) // self.threads)
        ds = grain.MapDataset.source(list(pairs)).batch(chunk, batch_fn=list).map(self._map.with_runs(verify, done))
        options = grain.ReadOptions(num_threads=self.threads, prefetch_buffer_size=self.threads)
        it = iter(ds.to_iter_dataset(options))
        try:
            return [score for scores in it for score in scores]
        finally:
            it.close()  # its prefetch threads end now, not whenever the iterator is collected

    def score_group(self, pairs: Sequence[tuple[Task, Prediction]], verify: bool = True,
                    done: dict[Job, RunResult] | None = None) -> list[Score]:
        """Scores of `pairs` in order, computed on the calling thread (test runs through the dispatcher)."""
        return self._map.with_runs(verify, done)(list(pairs))

    def close(self) -> None:
        """Stop the dispatcher thread (the fleet is the caller's to close)."""
        self._dispatcher.close()


def covered_s(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by at least one of the (begin, finish) `intervals`."""
    total, reached = 0.0, start
    for begin, finish in sorted(intervals):
        begin, finish = max(begin, reached), min(finish, end)
        if finish > begin:
            total += finish - begin
            reached = finish
    return total


class StreamedScoring:
    """One step's scoring, a group at a time as the engine finishes each task's samples.

    A context manager owning `pipeline.threads` threads: `scoring(i, completions)` (the
    engine's `on_prompt`) queues task i's group, built by `pairs_of(i, completions)`;
    `scores(n)` waits for groups 0..n−1 and returns their score rows in task order; on
    exit, groups not started are dropped and running ones finish, so no scoring outlives
    the step. Each group is timed on its thread: `busy_s(start, end)` is how much of a
    stage some group's scoring overlapped.
    """

    def __init__(self, pipeline: RewardPipeline,
                 pairs_of: Callable[[int, Sequence[object]], list[tuple[Task, Prediction]]], verify: bool = True):
        self.pipeline, self.pairs_of, self.verify = pipeline, pairs_of, verify
        self._pool = concurrent.futures.ThreadPoolExecutor(pipeline.threads, thread_name_prefix="reward-group")
        self._futures: dict[int, concurrent.futures.Future[list[Score]]] = {}
        self._done: dict[int, dict[Job, RunResult]] = {}  # per group: its runs' results
        self._intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> StreamedScoring:
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __call__(self, i: int, completions: Sequence[object]) -> None:
        if i in self._futures:
            raise RuntimeError(f"the engine reported prompt {i} twice")
        self._done[i] = {}
        self._futures[i] = self._pool.submit(self._score, self.pairs_of(i, completions), self._done[i])

    def _score(self, pairs: list[tuple[Task, Prediction]], done: dict[Job, RunResult]) -> list[Score]:
        begin = time.perf_counter()
        try:
            return self.pipeline.score_group(pairs, self.verify, done)
        finally:
            with self._lock:
                self._intervals.append((begin, time.perf_counter()))

    def scores(self, groups: int) -> list[Score]:
        """The score rows of groups 0..groups−1 in task order, once each was reported and scored."""
        missing = [i for i in range(groups) if i not in self._futures]
        if missing:
            raise RuntimeError(f"the engine never reported prompts {missing[:5]} as finished")
        return [s for i in range(groups) for s in self._futures[i].result()]

    def done(self) -> dict[Job, RunResult]:
        """The results of every run made so far (once `scores` returned: of all groups)."""
        return {job: result for runs in self._done.values() for job, result in runs.items()}

    def busy_s(self, start: float, end: float) -> float:
        """Seconds of [start, end] (`time.perf_counter`) during which some group was being scored."""
        with self._lock:
            return covered_s(self._intervals, start, end)


class DeferredVerification:
    """The verification and window runs of one step's rollouts, made on a thread of their own.

    For algorithms whose reward terms need only the unit runs (`jaxrl.algorithms.Resolved.verified`
    is False), the step scores with `verify=False` before the update and starts this right after:
    `pipeline(pairs, verify=True, done=done)` reuses the unit runs in `done` and makes the rest
    while the update runs; `result()` returns the full scores (the step's metrics read them), the
    same as scoring with `verify=True` at once.
    """

    def __init__(self, pipeline: RewardPipeline, pairs: Sequence[tuple[Task, Prediction]],
                 done: dict[Job, RunResult]):
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reward-verify")
        self._future = self._pool.submit(pipeline, list(pairs), True, done)
        self._pool.shutdown(wait=False)

    def result(self) -> list[Score]:
        """The full scores, in pair order, once every run is made."""
        return self._future.result()
