"""`EngineWorker`: one thread owns the model; requests that arrive together share one engine batch.

    worker = EngineWorker(engine, max_concurrent=16, batch_window_s=0.02)
    future = worker.submit(env, task, options)      # from any thread; a concurrent.futures.Future
    trajectory = future.result()

The worker waits for a first request, then `batch_window_s` for others to join it (at most
`max_concurrent`), and runs them all in one `RolloutEngine.run`, where they decode with continuous
batching (each forward covers every episode with a token to compute; one waiting on its tools
costs nothing). Each request brings its own sampling, seed, token limit and stop strings as
`EpisodeOptions`, so requests with different settings share a batch, and a request's seed gives
the same reply whichever requests share it (the backend contract).

A request whose client goes away sets its episode's `cancel` event: queued, it never runs; decoding,
the engine ends it at its next step and frees its slot (rollout/engine.py).

How it departs from a serving engine such as vLLM: a request that arrives while a batch decodes
waits for that batch to finish (the engine's `run` admits its episodes at the start), so under a
steady stream of requests its latency includes the rest of the running batch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
import time
from typing import Any

from agentic_rl.envs.base import Env, Task
from agentic_rl.rollout.engine import EpisodeOptions, RolloutEngine


class EpisodeCancelled(Exception):
    """A request's client went away before its episode was decoded: nothing ran for it."""


@dataclasses.dataclass
class _Job:
    env: Env
    task: Task
    options: EpisodeOptions
    future: concurrent.futures.Future


class EngineWorker:
    """Runs queued episodes in engine batches on its own thread (see the module docstring)."""

    def __init__(self, engine: RolloutEngine, max_concurrent: int, batch_window_s: float) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self.engine, self.max_concurrent, self.batch_window_s = engine, max_concurrent, batch_window_s
        self.batch_sizes: list[int] = []
        """Episodes in each engine run so far (for /health and tests)."""
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="engine-worker", daemon=True)
        self._thread.start()

    def submit(self, env: Env, task: Task, options: EpisodeOptions) -> concurrent.futures.Future:
        """Queue one episode; the future gets its Trajectory (or the exception its batch raised)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_Job(env, task, options, future))
        return future

    def stop(self) -> None:
        """Finish the batch in flight, then end the thread (queued requests are not run)."""
        self._queue.put(None)
        self._thread.join()

    def stats(self) -> dict[str, Any]:
        sizes = list(self.batch_sizes)
        return {
            "batches": len(sizes),
            "episodes": sum(sizes),
            "largest_batch": max(sizes, default=0),
            "queued": self._queue.qsize(),
        }

    def _loop(self) -> None:
        while (first := self._queue.get()) is not None:
            batch = [first]
            deadline = time.monotonic() + self.batch_window_s
            while len(batch) < self.max_concurrent:
                remaining = deadline - time.monotonic()  # past the window: take only what is already queued
                try:
                    job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(job)
            self._run([job for job in batch if not self._cancelled(job)])

    @staticmethod
    def _cancelled(job: _Job) -> bool:
        """Whether `job`'s client went away before its batch started; it then fails at once, unrun."""
        if job.options.cancel is None or not job.options.cancel.is_set():
            return False
        job.future.set_exception(EpisodeCancelled("the client went away before the request was decoded"))
        return True

    def _run(self, batch: list[_Job]) -> None:
        """Run `batch` as one engine batch. When it raises, each of its requests runs again alone, so
        the one that raised (a message the chat format cannot encode, a tool that breaks) fails alone
        and the others get their answers: one bad request never fails the batch it shared."""
        if not batch:
            return
        self.batch_sizes.append(len(batch))
        try:
            # Every served episode has its own sampling (and seed), so the run's seed is never drawn from.
            trajectories = self.engine.run(
                [job.env for job in batch], [job.task for job in batch], seed=0, options=[job.options for job in batch]
            )
        except BaseException as exc:  # noqa: BLE001 - the requests fail (500), the server goes on
            if len(batch) > 1:
                for job in batch:
                    self._run([job])
                return
            batch[0].future.set_exception(exc)
            return
        for job, trajectory in zip(batch, trajectories):
            job.future.set_result(trajectory)
