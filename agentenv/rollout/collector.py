"""Many concurrent episodes feeding a pool: the rollout side of the asynchronous loop.

A :class:`RolloutCollector` runs ``concurrency`` worker coroutines, each owning one environment
and playing episodes back to back through :func:`agentenv.rollout.episode.run_episode_samples`. Tasks are seeds
drawn in order from a seeded stream; a rejected trajectory's task can be put back with
:meth:`RolloutCollector.requeue`. In asynchronous mode the workers run while the learner trains;
in synchronous mode :meth:`RolloutCollector.collect` plays until it has exactly ``n`` good
trajectories and returns.

Groups. Every task is played ``group_size`` times (``n``; GRPO's rollouts per prompt, 1 for
FlashREINFORCE) with the same reset seed, hence the same prompt. The ``n`` members of a group may run
on different workers at once; the group is handed on only when all ``n`` are good, in one piece
(``on_group``, or ``on_trajectory`` once per member, back to back under a lock, so the pool sees the
group contiguous).

Sampling seeds. Every episode samples with its own seed, ``derive_seed(task seed, play, member,
attempt)`` (:func:`agentenv.engines.base.derive_seed`; ``play`` counts earlier groups of the same task
seed, e.g. a task requeued after a rejection), handed to :func:`~agentenv.rollout.episode.run_episode_samples`.
Its tokens then depend only on its task and the weights, not on which other episodes shared the
engine's batch: a synchronous run with a given ``run.seed`` is reproducible.

Samples. An episode is normally one trajectory; with ``rollout.on_prefix_violation="split"`` (or an
agent program that rewrites its history, :mod:`agentenv.agents`) it can be several samples, all with
the episode's reward. With ``group_size == 1`` every sample is handed on as its own group of 1
(``info["sample"]``/``info["samples"]`` say which), back to back; with ``group_size > 1`` a group
needs one row per rollout, so ``"split"`` is refused and an episode that split anyway fails (it is
replayed like any failed episode).

Failures. An episode *failed*, for reasons outside the policy, when

* its status is ``"error"`` (engine error, environment or sandbox crash, chat-template error: what
  :func:`~agentenv.rollout.episode.run_episode` records in ``info["error"]``), or
* it has no policy token (a prompt longer than the context, an engine that returned an empty
  completion, ``reset`` succeeding but nothing sampled). An *empty completion* means exactly this:
  zero policy tokens. A reply that is only the stop token is the policy's own (sampled, with a
  log-probability) choice and is kept and scored like any other.

A failed episode is never handed on (it would enter a batch with reward 0 and a baseline it does
not belong to). It is counted, its environment is closed and rebuilt (a crashed sandbox is not
reused), and the same group member is replayed; a member that fails ``max_retries + 1`` times drops
its task, with the whole group (good members already played are discarded and counted). A dropped
task is not requeued; the stream moves on to the next seed.

Stopping rule. ``failure_streak`` counts consecutive failures in completion order (failed episodes,
hand-on errors and worker crashes; a good episode resets it). When it reaches ``failure_limit``
(default ``max(16, 4 * concurrency)``) the collector stops for good: :attr:`fatal` holds an
:class:`~agentenv.errors.AgentEnvError` naming the last error, the workers start nothing new,
:meth:`collect` raises it, and the streak is frozen so a trainer polling it sees the limit. With
independent failures at rate ``p`` the expected number of episodes before ``L`` failures in a row
is about ``1 / ((1 - p) p^L)``: for ``L = 16``, about 44 at ``p = 0.9``, about 400 at ``p = 0.75``,
1.3e5 at ``p = 0.5`` and 6e8 at ``p = 0.3``: a broken or mostly broken environment stops the run
within a few hundred episodes, while intermittent failures never do.

Robustness. A worker survives any episode's failure and any exception from ``on_trajectory``/
``on_group`` or the environment (logged, counted, streak bumped, it goes on); a worker coroutine
that dies anyway is restarted.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentenv.core import Env
from agentenv.engines.base import GenerationEngine, derive_seed
from agentenv.errors import AgentEnvError, ConfigError
from agentenv.faults import FAULTS
from agentenv.rollout.episode import Renderer, RolloutConfig, run_episode_samples
from agentenv.rollout.task_stream import Group, TaskStream
from agentenv.trajectory import Trajectory

logger = logging.getLogger(__name__)

MAX_RETRIES = 2
"""Times a task whose episode failed outside the policy's control is replayed before it is dropped."""
_IDLE_S = 0.05  # seconds a worker waits before asking admission again (or after a crash)
_CLOSE_TIMEOUT_S = 30.0  # seconds allowed for closing a failed episode's environment


def failure_reason(traj: Trajectory) -> str | None:
    """Why ``traj`` failed for reasons outside the policy, or None when it is a good trajectory.

    Failed: status ``"error"`` (the recorded ``info["error"]``), or no policy token at all.
    """
    if traj.status == "error":
        return str(traj.info.get("error") or "episode error")
    if traj.num_policy_tokens == 0:
        cut = traj.info.get("truncation")
        why = "the prompt fills the context" if cut == "context" else f"truncation: {cut}"
        return f"no policy token (empty completion; {why})"
    return None


class NoUpdateWatch:
    """Warns when a wait for the next update has lasted ``every_s`` seconds, and again each ``every_s``.

    Made by :meth:`RolloutCollector.no_update_watch` when a wait starts (a training loop's wait for a
    batch, :meth:`RolloutCollector.collect`); :meth:`check` is called as the wait goes on.

    Args:
        every_s: Seconds between warnings (> 0).
        report: The collector's :meth:`~RolloutCollector.progress_report`, called only to warn.
        clock: Monotonic seconds (tests pass a fake).
    """

    def __init__(self, every_s: float, report: Callable[[], str], clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s, self._report, self._clock = every_s, report, clock
        self._start = clock()
        self.warnings = 0  #: warnings given so far

    def check(self, waiting_for: str) -> None:
        """Log a warning if another ``every_s`` passed; ``waiting_for`` says what is still missing."""
        waited = self._clock() - self._start
        if waited >= (self.warnings + 1) * self._every_s:
            self.warnings += 1
            logger.warning("no update for %.0f s: %s; %s", waited, waiting_for, self._report())


class RolloutCollector:
    """Runs episodes concurrently and hands each finished good trajectory (or group) on.

    Args:
        env_factory: Builds one environment per worker (called ``concurrency`` times, and again to
            replace the environment of a failed episode).
        engine: The shared generation engine (batches across workers).
        renderer: Chat renderer of the engine's tokenizer.
        cfg: Per-episode budgets and sampling.
        on_trajectory: Receives every good trajectory (the pool's ``add``), members of a group back
            to back; never a failed one. May be None when ``on_group`` is given.
        concurrency: Episodes in flight at once.
        version_fn: The learner's current policy version.
        first_seed: Seed of the first task; task k uses ``first_seed + k``.
        admit: Back-pressure: a worker starts a new episode only while this returns True.
        max_retries: A failed episode's group member is replayed up to this many times; one more
            failure drops the task (and its group). 0 drops a task at its first failure.
        group_size: ``n``, rollouts per task (same seed, same prompt), handed on together.
        on_group: Receives each complete group as a list of ``n`` trajectories (the pool's
            ``add_group``); used instead of ``on_trajectory`` when given.
        failure_limit: Consecutive failures that stop the collector (see the module docstring);
            None means ``max(16, 4 * concurrency)``.

    Attributes:
        episodes_started / episodes_finished: Episodes begun / ended (good or failed; cancelled
            ones are not finished).
        in_flight: Episodes being played now (a cancelled one stops counting when it is cancelled).
        episodes_failed: Finished episodes that failed (each attempt counts; also ``errors``).
        episodes_retried: Failed episodes that were replayed.
        episodes_requeued: Episodes cut by an engine that died and was rebuilt (``info["requeue"]``):
            replayed from the start without spending an attempt (not counted as failed).
        stragglers: Finished episodes that ran past a deadline (``rollout.episode_deadline_s`` or
            ``turn_deadline_s``), truncated or failed as ``rollout.on_deadline`` says.
        tasks_dropped: Tasks (groups) dropped after ``max_retries + 1`` failures of one member.
        episodes_discarded: Good episodes not handed on (their group was dropped, or handing on
            raised).
        episodes_delivered: Good trajectories handed on.
        delivery_errors: Calls of ``on_trajectory``/``on_group`` that raised.
        worker_restarts: Worker coroutines that died and were restarted.
        failure_streak: Consecutive failures (see the module docstring); frozen once :attr:`fatal`.
        last_error: The latest failure's message (None before any).
        fatal: The :class:`AgentEnvError` that stopped the collector, or None.

    Raises:
        ConfigError: ``concurrency``, ``group_size`` or ``failure_limit`` below 1, ``max_retries``
            below 0, or neither ``on_trajectory`` nor ``on_group``.
    """

    def __init__(
        self,
        env_factory: Callable[[], Env],
        engine: GenerationEngine,
        renderer: Renderer,
        cfg: RolloutConfig,
        on_trajectory: Callable[[Trajectory], None | Awaitable[None]] | None,
        *,
        concurrency: int = 8,
        version_fn: Callable[[], int] | None = None,
        first_seed: int = 0,
        admit: Callable[[], bool] | None = None,
        max_retries: int = MAX_RETRIES,
        group_size: int = 1,
        on_group: Callable[[list[Trajectory]], None | Awaitable[None]] | None = None,
        failure_limit: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {group_size}")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        if failure_limit is not None and failure_limit < 1:
            raise ConfigError(f"failure_limit must be >= 1, got {failure_limit}")
        if on_trajectory is None and on_group is None:
            raise ConfigError("RolloutCollector needs on_trajectory or on_group")
        if group_size > 1 and cfg.on_prefix_violation == "split":
            raise ConfigError(f"group_size={group_size} with rollout.on_prefix_violation='split': a group needs one "
                              "row per rollout; use 'append'")
        self._env_factory = env_factory
        self._engine = engine
        self._renderer = renderer
        self._cfg = cfg
        self._on_trajectory = on_trajectory
        self._on_group = on_group
        self._concurrency = concurrency
        self._version_fn = version_fn
        self._tasks = TaskStream(first_seed, group_size)
        self._admit = admit or (lambda: True)
        self._max_retries = max_retries
        self._group_size = group_size
        self.failure_limit = failure_limit if failure_limit is not None else max(16, 4 * concurrency)
        """Consecutive failures that stop the collector."""
        self._deliver_lock = asyncio.Lock()
        self._workers: list[asyncio.Task | None] = []
        self._envs: list[Env] = []
        self._stopping = False
        self.episodes_started = 0
        self.episodes_finished = 0
        self.in_flight = 0
        self.episodes_failed = 0
        self.episodes_retried = 0
        self.episodes_requeued = 0
        self.stragglers = 0
        self.tasks_dropped = 0
        self.episodes_discarded = 0
        self.episodes_delivered = 0
        self.delivery_errors = 0
        self.worker_restarts = 0
        self.failure_streak = 0
        self.last_error: str | None = None
        self.fatal: AgentEnvError | None = None
        self._reported: dict[str, int] = {}

    #: Seconds a wait for the next update lasts before a warning that no update came (and again each
    #: as many seconds): 3.5x the CPU recipe's 85 s per update on a busy 2-core VM (45 s idle).
    no_update_warning_s: float = 300.0

    def no_update_watch(self) -> NoUpdateWatch:
        """A :class:`NoUpdateWatch` of this collector, started now (``every_s`` = :attr:`no_update_warning_s`)."""
        return NoUpdateWatch(self.no_update_warning_s, self.progress_report)

    def progress_report(self) -> str:
        """One line on the episodes so far, for the warning that no update came (:attr:`no_update_warning_s`).

        Example: ``"16 episodes in flight, 40 finished, 38 delivered, 2 failed (2 past a deadline);
        failure streak 2; last error: straggler: episode deadline of 650 s passed in env"``.
        """
        line = (f"{self.in_flight} episodes in flight, {self.episodes_finished} finished, {self.episodes_delivered} "
                f"delivered, {self.episodes_failed} failed ({self.stragglers} past a deadline); "
                f"failure streak {self.failure_streak}")
        return line + (f"; last error: {self.last_error}" if self.last_error else "")

    @property
    def errors(self) -> int:
        """Failed episodes so far (each attempt counts): the same as :attr:`episodes_failed`."""
        return self.episodes_failed

    @property
    def group_size(self) -> int:
        """``n``: rollouts per task."""
        return self._group_size

    # -- tasks ----------------------------------------------------------------------------------
    def requeue(self, traj: Trajectory) -> None:
        """Put the task of ``traj`` (e.g. rejected as too stale) back in the queue, to be played anew.

        For groups, only the first member (``info["member"] == 0``) requeues, so a rejected group
        (its members are rejected together) puts its task back once; of a split episode's samples,
        only the first (``info["sample"] == 0``) does.
        """
        seed = traj.info.get("seed")
        if seed is not None and traj.info.get("member", 0) == 0 and traj.info.get("sample", 0) == 0:
            self._tasks.requeue(int(seed))

    @property
    def next_seed(self) -> int:
        """Seed of the next fresh task (saved in checkpoints)."""
        return self._tasks.next_seed

    @next_seed.setter
    def next_seed(self, value: int) -> None:
        self._tasks.next_seed = value

    def state_dict(self) -> dict[str, Any]:
        """Where the task stream stands, for a checkpoint (:meth:`agentenv.rollout.task_stream.TaskStream.state_dict`).

        Taken between two steps of the event loop with a synchronous ``on_group``/``on_trajectory``
        (the pool's), every task handed out so far is then in exactly one place: in flight,
        requeued, handed on, or dropped.
        """
        return self._tasks.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> list[int]:
        """Continue the task stream of a :meth:`state_dict` (call before :meth:`start` or :meth:`collect`).

        The tasks that were in flight are requeued first, in their order, then the requeued ones; each
        is played anew from its start (partial episodes, and finished members of an open group, are
        not kept).

        Returns:
            The seeds of the in-flight tasks requeued.

        Raises:
            DataError: A key is missing or a seed is not an integer; the collector is unchanged.
        """
        return self._tasks.load_state_dict(state)

    # -- failures -------------------------------------------------------------------------------
    def _bump_streak(self, reason: str) -> None:
        if self.fatal is not None:
            return
        self.failure_streak += 1
        self.last_error = reason
        if self.failure_streak >= self.failure_limit:
            self.fatal = AgentEnvError(f"the last {self.failure_streak} episodes all failed; "
                                       f"the latest with: {reason}")
            logger.error("rollout collector stops: %s", self.fatal)

    def _drop(self, group: Group) -> None:
        group.dropped = True
        self.tasks_dropped += 1
        self.episodes_discarded += sum(len(m) for m in group.members if m is not None)
        self._tasks.close(group)

    async def _replace_env(self, slot: int) -> None:
        """Build a fresh environment for ``slot``, then close the old one (a close error is logged).

        Raises:
            Exception: Whatever ``env_factory`` raises (the old environment is kept then).
        """
        t0 = time.monotonic()
        old = self._envs[slot]
        self._envs[slot] = self._env_factory()
        FAULTS.record("env_replaced", time.monotonic() - t0)  # the slot plays again once it is built
        try:
            await asyncio.wait_for(old.close(), _CLOSE_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("closing a failed episode's environment raised %s: %s", type(exc).__name__, exc)

    # -- episodes -------------------------------------------------------------------------------
    async def _episode(self, slot: int, group: Group, m: int) -> list[Trajectory] | None:
        """Play member ``m`` of ``group`` on environment ``slot``.

        Returns the group's trajectories (every member's samples, in member order) when this episode
        completed it, else None. Never raises but :class:`asyncio.CancelledError` (then ``m`` is put
        back to be played again).
        """
        self.episodes_started += 1
        self.in_flight += 1
        try:
            samples = await run_episode_samples(self._envs[slot], self._engine, self._renderer, self._cfg,
                                                seed=group.seed, version_fn=self._version_fn,
                                                sampling_seed=derive_seed(group.seed, group.play, m,
                                                                          group.failures[m]))
        except asyncio.CancelledError:
            if not group.dropped:
                group.todo.appendleft(m)
            raise
        except Exception as exc:  # run_episode_samples records failures itself; this guards against the rest
            samples = [Trajectory(status="error", info={"error": f"{type(exc).__name__}: {exc}"})]
        finally:
            self.in_flight -= 1
        self.episodes_finished += 1
        self.stragglers += bool(samples[-1].info.get("straggler"))
        for traj in samples:
            traj.info.update(seed=group.seed, attempt=group.failures[m], group=group.key, member=m)
        kept = [t for t in samples if t.num_policy_tokens]  # a split's last sample may end before a reply
        reason = failure_reason(samples[-1]) if samples[-1].status == "error" or not kept else None
        if reason is None and len(kept) > 1 and self._group_size > 1:
            reason = (f"the episode split into {len(kept)} samples (a history the template or the agent rewrote); "
                      f"a group of {self._group_size} needs one row per rollout")
        if reason is None:
            if self.fatal is None:
                self.failure_streak = 0
            if group.dropped:
                self.episodes_discarded += len(kept)
                return None
            group.members[m] = kept
            if not group.complete:
                return None
            self._tasks.close(group)
            return [t for member in group.members if member is not None for t in member]
        if samples[-1].info.get("requeue"):  # the engine died under it and was rebuilt: play it again, no attempt spent
            self.episodes_requeued += 1
            if not group.dropped:
                group.todo.appendleft(m)
            return None
        self.episodes_failed += 1
        self._bump_streak(reason)
        if not group.dropped:
            group.failures[m] += 1
            if group.failures[m] > self._max_retries:
                logger.warning("dropping task %s after %d failed attempts; the last: %s",
                               group.seed, group.failures[m], reason)
                self._drop(group)
            else:
                logger.warning("replaying task %s (attempt %d) after: %s", group.seed, group.failures[m], reason)
                self.episodes_retried += 1
                group.todo.appendleft(m)
        try:
            await self._replace_env(slot)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._bump_streak(f"building an environment: {type(exc).__name__}: {exc}")
            logger.warning("rebuilding the environment raised %s: %s (keeping the old one)", type(exc).__name__, exc)
        return None

    async def _deliver(self, trajs: list[Trajectory]) -> None:
        """Hand a complete group on, in one piece; an exception is logged and counted, not raised.

        ``trajs`` is one group of ``group_size``, or with groups of 1 an episode's samples, each
        handed on as its own group.
        """
        async with self._deliver_lock:
            try:
                if self._on_group is not None:
                    for i in range(0, len(trajs), self._group_size):
                        result = self._on_group(trajs[i : i + self._group_size])
                        if asyncio.iscoroutine(result):
                            await result
                else:
                    assert self._on_trajectory is not None
                    for traj in trajs:
                        result = self._on_trajectory(traj)
                        if asyncio.iscoroutine(result):
                            await result
                self.episodes_delivered += len(trajs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.delivery_errors += 1
                self.episodes_discarded += len(trajs)
                reason = f"handing on trajectory {trajs[0].id} raised {type(exc).__name__}: {exc}"
                logger.warning("%s (discarded; the collector goes on)", reason)
                self._bump_streak(reason)

    async def _worker(self, slot: int) -> None:
        while not self._stopping and self.fatal is None:
            if not self._admit():
                await asyncio.sleep(_IDLE_S)
                continue
            job = self._tasks.next_job()
            assert job is not None
            done = await self._episode(slot, *job)
            if done is not None:
                await self._deliver(done)

    def _spawn(self, slot: int) -> None:
        task = asyncio.create_task(self._worker(slot))
        task.add_done_callback(lambda t, slot=slot: self._worker_done(slot, t))
        self._workers[slot] = task

    def _worker_done(self, slot: int, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None or self._stopping:
            return
        reason = f"collector worker crashed: {type(exc).__name__}: {exc}"
        logger.error("%s; restarting it", reason, exc_info=exc)
        self._bump_streak(reason)
        if self.fatal is not None:
            return
        self.worker_restarts += 1

        async def restart() -> None:
            await asyncio.sleep(_IDLE_S)
            await self._worker(slot)

        new = asyncio.get_running_loop().create_task(restart())
        new.add_done_callback(lambda t, slot=slot: self._worker_done(slot, t))
        self._workers[slot] = new

    def _ensure_envs(self) -> None:
        if not self._envs:
            self._envs = [self._env_factory() for _ in range(self._concurrency)]

    async def start(self) -> None:
        """Start the workers (asynchronous mode). They run until :meth:`stop` or :attr:`fatal`."""
        if any(w is not None and not w.done() for w in self._workers):
            return
        self._stopping = False
        self._ensure_envs()
        self._workers = [None] * self._concurrency
        for slot in range(self._concurrency):
            self._spawn(slot)

    async def stop(self) -> None:
        """Stop the workers; in-flight episodes are cancelled and will be played again (same group)."""
        self._stopping = True
        workers = [w for w in self._workers if w is not None]
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._workers = []

    async def collect(self, n: int) -> list[Trajectory]:
        """Play until ``n`` good trajectories are ready and return them (synchronous mode).

        Whole groups, each contiguous, in the order their tasks were opened; failed episodes are
        replayed or their tasks dropped and replaced by the next task, so none of them failed. The
        result has exactly ``n`` trajectories (``n / group_size`` groups) unless episodes split into
        several samples (``rollout.on_prefix_violation="split"``, groups of 1): then new tasks are
        opened only while fewer than ``n`` samples are done, and the result holds every sample of the
        episodes played (at least ``n``).

        Raises:
            ConfigError: ``n`` is not a positive multiple of ``group_size``.
            AgentEnvError: :attr:`fatal`: ``failure_limit`` failures in a row (now or before).
        """
        g = self._group_size
        if n < 1 or n % g:
            raise ConfigError(f"collect needs a positive multiple of the group size {g}, got {n}")
        if self.fatal is not None:
            raise self.fatal
        self._ensure_envs()
        done: list[list[Trajectory]] = []
        free = collections.deque(range(self._concurrency))
        inflight: dict[asyncio.Future, int] = {}
        watch = self.no_update_watch()
        try:
            while (have := sum(map(len, done))) < n:
                if self.fatal is not None:
                    raise self.fatal
                while free:
                    job = self._tasks.next_job(max_groups=-(-(n - have) // g))
                    if job is None:
                        break
                    slot = free.popleft()
                    inflight[asyncio.ensure_future(self._episode(slot, *job))] = slot
                if not inflight:  # cannot happen: an open group has a pending member or one in flight
                    raise AgentEnvError("collector: nothing left to play")
                finished, _ = await asyncio.wait(inflight, timeout=self.no_update_warning_s,
                                                 return_when=asyncio.FIRST_COMPLETED)
                watch.check(f"{have} of {n} trajectories collected")
                for fut in finished:
                    free.append(inflight.pop(fut))
                    group = fut.result()
                    if group is not None:
                        done.append(group)
        finally:
            for fut in inflight:
                fut.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)
        done.sort(key=lambda group: group[0].info["group"])  # the order the tasks were opened
        out = [t for group in done for t in group]
        self.episodes_delivered += len(out)
        return out

    def report_counts(self) -> dict[str, int]:
        """Failure counters for one metrics row: totals, and the change since the previous call.

        Keys: ``failed``/``retried``/``dropped_tasks``/``stragglers``/``requeued`` (since the previous call) and their
        ``*_total``; ``discarded_total``, ``delivery_errors_total``, ``worker_restarts_total``,
        ``failure_streak``. Call once per update.
        """
        totals = {"failed": self.episodes_failed, "retried": self.episodes_retried,
                  "dropped_tasks": self.tasks_dropped, "stragglers": self.stragglers,
                  "requeued": self.episodes_requeued}
        row = {k: v - self._reported.get(k, 0) for k, v in totals.items()}
        row.update({f"{k}_total": v for k, v in totals.items()})
        row.update(discarded_total=self.episodes_discarded, delivery_errors_total=self.delivery_errors,
                   worker_restarts_total=self.worker_restarts, failure_streak=self.failure_streak)
        self._reported = totals
        return row

    async def close(self) -> None:
        """Stop the workers and close every environment (a close that raises is logged)."""
        await self.stop()
        for env in self._envs:
            try:
                await env.close()
            except Exception as exc:
                logger.warning("closing an environment raised %s: %s", type(exc).__name__, exc)
        self._envs = []

