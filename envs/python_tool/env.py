"""``python_tool``: a math problem, a sandboxed ``python`` tool, reward 1 for a correct boxed answer."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from agentenv.core import Demonstration, Env, StepResult, TaskSet, text_space
from agentenv.envs.python_tool.datasets import MathProblem, load_math
from agentenv.envs.python_tool.grading import Grader, default_grader
from agentenv.envs.python_tool.tool import PYTHON_TOOL_SCHEMA, SYSTEM_PROMPT, check_arguments, format_result
from agentenv.errors import ClosedError, ConfigError, DataError, GradingError, ResetNeeded
from agentenv.faults import fault_point
from agentenv.rollout.tool_calls import HermesToolCallParser, ToolCallError, ToolCallParser, get_tool_parser
from agentenv.sandboxes import SandboxLimits, create_sandbox_pool

INSTRUCTION = "\n\nPut your final answer within \\boxed{}."


def problem_kind(problem: MathProblem) -> str:
    """A problem's family or subject, read from its id: the folder above the row id.

    ``"tool_arith_eval/lcm/3"`` -> ``"lcm"``; ``"math500/test/precalculus/807.json"`` ->
    ``"precalculus"``; ids without a folder (``"aime24/60"``) give the set name (``"aime24"``).
    """
    parts = problem.id.split("/")[1:]
    return parts[-2] if len(parts) >= 2 else problem.source


class PythonToolEnv(Env[str, str]):
    r"""Solve a math problem with a Python tool; reward 1.0 when the final ``\\boxed{}`` is right.

    Episode: ``reset`` shows a problem (user message). Each ``step`` takes the model's reply. Tool
    calls in it run, in order, in the episode's persistent sandbox and the results come back as
    one ``tool`` observation; a malformed call, an unknown tool or empty code gives an error entry
    in that observation and the episode goes on. A reply without any tool call is the final
    answer: the episode terminates with reward 1.0 if its last ``\\boxed{}`` matches the ground truth
    (:mod:`agentenv.envs.python_tool.grading`), else 0.0. After ``max_turns`` replies with tool calls it is truncated
    (reward 0.0).

    Args:
        dataset: Math set name (:func:`agentenv.envs.python_tool.datasets.dataset_names`).
        max_turns: Most replies (steps) per episode, >= 1.
        sandbox_backend: ``"auto"``, ``"docker"``, ``"bwrap"`` or ``"process"``.
        sandbox_timeout_s: Seconds one tool call may run.
        sandbox_pool: An existing pool to share (not closed by this env); by default the env builds
            its own pool of ``pool_size`` on first use and closes it in :meth:`close`.
        pool_size: Warm sandboxes of the env's own pool.
        tool_parser: Tool-call parser, or the name of a registered one (``"qwen3"``, ``"llama3_json"``,
            ... :data:`agentenv.rollout.tool_calls.TOOL_PARSERS`; ``parser_for_template`` names the one a chat
            template implies); default :class:`~agentenv.rollout.tool_calls.HermesToolCallParser`.
        trailing_text: What the default parser does with text after a reply's last ``</tool_call>``:
            ``"ignore"`` it (default) or make the reply one malformed call (``"error"``; the CPU
            recipe's choice, see :class:`~agentenv.rollout.tool_calls.HermesToolCallParser`). Only with the
            hermes parser built from a name (``None``, ``"hermes"``, ``"qwen25"``).
        problems: An explicit problem list; overrides ``dataset``.
        max_problem_chars: Keep only problems at most this many characters long (None keeps all),
            in their order; e.g. short "Compute ..." problems a 135M model can turn into one expression.
        grade_timeout_s: Seconds grading one answer may take; past it the grading worker is killed.
            A worker that spent the time computing on the answer grades it wrong (reward 0, reason
            ``"timeout after N s"``, ``info["grading_timeout"]``); one that stalled (stopped or
            starved of CPU) or died makes ``step`` raise ``GradingError`` (replayed, never scored).
        grader: Grader to use; default the process-wide one.
        max_output_chars: Characters kept of each stream of each tool result.
        data_root: Shared data folder (default :func:`agentenv.paths.data_dir`).

    Tasks: :meth:`tasks` lists the problems in order (ids = problem ids, kinds =
    :func:`problem_kind`); ``reset(options={"task": i})`` plays problem ``i``.

    Raises:
        ConfigError: ``max_turns < 1``, an empty ``problems`` list, ``max_problem_chars`` leaving
            no problem, an unknown ``tool_parser`` name, or ``trailing_text`` other than ``"ignore"``
            with a parser instance or a non-hermes parser.
        DataError: Unknown data set or missing file.
    """

    observation_role: ClassVar[str] = "tool"
    tools: Sequence[Mapping[str, Any]] = (PYTHON_TOOL_SCHEMA,)
    system_prompt: str | None = SYSTEM_PROMPT
    timing_info_keys: ClassVar[tuple[str, ...]] = ("sandbox_s", "grading_s")
    observation_space = text_space(1 << 17)
    action_space = text_space(1 << 16)
    demonstrations_tag: ClassVar[str | None] = ""  # adds nothing to the warm-up cache key (the CPU default's)
    #: Expected seconds of one turn (a reply generated on a CPU engine and its tool call): the unit
    #: of the episode deadline.
    expected_turn_s: ClassVar[float] = 15.0

    def __init__(
        self,
        dataset: str = "math_train",
        max_turns: int = 4,
        sandbox_backend: str = "auto",
        sandbox_timeout_s: float = 10.0,
        sandbox_pool: Any = None,
        pool_size: int = 1,
        tool_parser: ToolCallParser | str | None = None,
        problems: Sequence[MathProblem] | None = None,
        grade_timeout_s: float = 5.0,
        grader: Grader | None = None,
        max_output_chars: int = 4096,
        data_root: str | None = None,
        max_problem_chars: int | None = None,
        trailing_text: str = "ignore",
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {max_turns}")
        if problems is not None:
            if not problems:
                raise ConfigError("problems must not be empty")
            self.problems = tuple(problems)
        else:
            self.problems = load_math(dataset, data_root=data_root)
        if max_problem_chars is not None:
            kept = tuple(p for p in self.problems if len(p.problem) <= max_problem_chars)
            if not kept:
                source = "the given problems" if problems is not None else f"data set {dataset!r}"
                raise ConfigError(f"max_problem_chars={max_problem_chars} leaves none of the "
                                  f"{len(self.problems)} problems of {source}")
            self.problems = kept
        self._tasks: TaskSet | None = None
        self.max_turns = max_turns
        self.sandbox_backend = sandbox_backend
        self.sandbox_timeout_s = sandbox_timeout_s
        self._pool = sandbox_pool
        self._own_pool = sandbox_pool is None
        self._pool_size = pool_size
        given = tool_parser
        if tool_parser is None or isinstance(tool_parser, str):
            tool_parser = get_tool_parser(tool_parser or "hermes")  # ConfigError for an unknown name
        if trailing_text != "ignore":
            if type(tool_parser) is not HermesToolCallParser or not (given is None or isinstance(given, str)):
                raise ConfigError(f"trailing_text={trailing_text!r} applies to the hermes parser built here only; "
                                  f"tool_parser {given!r} was given")
            tool_parser = HermesToolCallParser(trailing_text)
        self.parser = tool_parser
        self.grade_timeout_s = grade_timeout_s
        self._grader = grader
        self.max_output_chars = max_output_chars
        self._sandbox: Any = None
        self._problem: MathProblem | None = None
        self._done = True
        self._stats: dict[str, Any] = {}

    @property
    def episode_deadline_s(self) -> float:
        """The default episode deadline (seconds): 10x the expected episode time.

        Expected: ``max_turns`` x :attr:`expected_turn_s` + ``grade_timeout_s`` (65 s with the
        defaults; the deadline 650 s). ``rollout.episode_deadline_s`` overrides it
        (:func:`agentenv.rollout.episode.episode_deadline`).
        """
        return 10 * (self.max_turns * self.expected_turn_s + self.grade_timeout_s)

    def tasks(self) -> TaskSet:
        """The problems in order: ids are problem ids, kinds their family or subject (:func:`problem_kind`)."""
        if self._tasks is None:
            self._tasks = TaskSet(tuple(p.id for p in self.problems), tuple(map(problem_kind, self.problems)))
        return self._tasks

    @classmethod
    def scripted_demonstrations(cls, *, count: int, seed: int) -> list[Demonstration]:
        """``count`` scripted one-call arithmetic episodes (:mod:`agentenv.envs.python_tool.demonstrations`).

        The same ``seed`` gives the same problems; each is an episode of this env (system prompt,
        tool schema, the tool result as this env formats it with 4000 characters kept).
        """
        from agentenv.envs.python_tool.demonstrations import demonstration, scripted_problem
        from agentenv.sandboxes.base import ExecResult, ExecStatus

        rng = random.Random(seed)
        return [
            demonstration(scripted_problem(rng), system=cls.system_prompt, tools=cls.tools,
                          observation_role=cls.observation_role,
                          format_observation=lambda out: format_result(ExecResult(ExecStatus.OK, stdout=out), 4000))
            for _ in range(count)
        ]

    # -- lifecycle ------------------------------------------------------------------------------
    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on one problem.

        Args:
            seed: Seeds the env's generator; the same seed picks the same problem.
            options: ``{"task": i}`` (or its older name ``{"index": i}``) plays problem ``i`` of
                :meth:`tasks` instead of a random one.

        Returns:
            The problem text and ``info`` with ``task_id`` (= ``problem_id``), ``index`` and
            ``ground_truth``.

        Raises:
            ClosedError: The env is closed.
            DataError: The task index is out of range.
        """
        if self._closed:
            raise ClosedError("PythonToolEnv is closed")
        await super().reset(seed=seed)
        await self._end_episode()
        options = options or {}
        index = options.get("task", options.get("index"))
        if index is None:
            index = int(self.np_random.integers(len(self.problems)))
        elif not 0 <= int(index) < len(self.problems):
            raise DataError(f"problem index {index} out of range [0, {len(self.problems)})")
        self._problem = self.problems[int(index)]
        self._done = False
        self._stats = {"turn": 0, "tool_calls": 0, "tool_errors": 0, "sandbox_s": 0.0, "grading_s": 0.0}
        info = {"task_id": self._problem.id, "problem_id": self._problem.id, "index": int(index),
                "ground_truth": self._problem.answer}
        return self._problem.problem + INSTRUCTION, info

    async def step(self, action: str) -> StepResult[str]:
        """Run the reply's tool calls, or grade it when it has none (see the class docstring).

        Raises:
            ResetNeeded: No episode is running.
            SandboxError: The sandbox backend cannot start a worker, or the episode's worker died between
                two calls (its state is lost).
            GradingError: The grading worker stalled (passed ``grade_timeout_s`` without computing) or
                died: the answer was not graded, which is not the policy's doing (the episode fails
                and is replayed). An answer too expensive to verify is graded wrong instead.
        """
        if self._done or self._problem is None:
            raise ResetNeeded("call reset() before step() (the episode is over or never started)")
        fault_point("python_tool.step")  # tests: AGENTENV_FAULT=python_tool.step:K crashes the env here
        s = self._stats
        s["turn"] += 1
        parsed = self.parser.parse(action if isinstance(action, str) else str(action))
        if not parsed.attempted:
            return await self._finish(action)
        parts: list[str] = []
        items = parsed.items or (*parsed.errors, *parsed.calls)
        n = len(items)
        for item in items:
            if isinstance(item, ToolCallError):
                s["tool_errors"] += 1
                parts.append(f"error: malformed tool call: {item.message}")
                continue
            s["tool_calls"] += 1
            try:
                code = check_arguments(item.name, item.arguments)
            except ValueError as exc:
                s["tool_errors"] += 1
                parts.append(f"error: {exc}")
                continue
            result = await self._run(code)
            if not result.ok:
                s["tool_errors"] += 1
            parts.append(format_result(result, self.max_output_chars))
        if n > 1:
            parts = [f"[call {i + 1} of {n}]\n{p}" for i, p in enumerate(parts)]
        observation = "\n\n".join(parts)
        limit = self.observation_space.max_length
        if len(observation) > limit:
            observation = observation[: limit - 40] + "\n... [observation cut]"
        truncated = s["turn"] >= self.max_turns
        if truncated:
            await self._end_episode()
        return StepResult(observation, 0.0, False, truncated, self._info(truncated=truncated))

    async def close(self) -> None:
        """Release the sandbox and close the env's own pool. Safe to call twice."""
        await self._end_episode()
        if self._own_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()
        await super().close()

    # -- internals ------------------------------------------------------------------------------
    async def _run(self, code: str) -> Any:
        t0 = time.perf_counter()
        if self._sandbox is None:
            if self._pool is None:
                limits = SandboxLimits(timeout_s=self.sandbox_timeout_s)
                self._pool = create_sandbox_pool(
                    backend=self.sandbox_backend, size=self._pool_size, limits=limits
                )
            self._sandbox = await self._pool.acquire()
        result = await self._sandbox.run(code, timeout_s=self.sandbox_timeout_s)
        self._stats["sandbox_s"] += time.perf_counter() - t0
        return result

    async def _finish(self, reply: str) -> StepResult[str]:
        assert self._problem is not None
        grader = self._grader or default_grader()
        t0 = time.perf_counter()
        grade = await grader.grade_async(reply, self._problem.answers, timeout_s=self.grade_timeout_s)
        self._stats["grading_s"] = time.perf_counter() - t0
        if grade.fault is not None:  # the grader stalled or died: not the answer's verdict, never reward 0
            await self._end_episode()
            raise GradingError(f"the answer could not be graded: {grade.reason} (the episode is played again)")
        await self._end_episode()
        info = self._info(truncated=False)
        info.update(extracted_answer=grade.extracted, grade_reason=grade.reason, correct=grade.correct,
                    grading_timeout=grade.timed_out)
        return StepResult("", 1.0 if grade.correct else 0.0, True, False, info)

    def _info(self, *, truncated: bool) -> dict[str, Any]:
        assert self._problem is not None
        backend = getattr(self._pool, "backend", None) if self._pool is not None else None
        return {
            **self._stats,
            "problem_id": self._problem.id,
            "ground_truth": self._problem.answer,
            "sandbox_backend": backend,
            "truncated_by": "max_turns" if truncated else None,
        }

    async def _end_episode(self) -> None:
        self._done = True
        sb, self._sandbox = self._sandbox, None
        if sb is not None and self._pool is not None:
            await self._pool.release(sb)

    def __repr__(self) -> str:
        n, turns, backend = len(self.problems), self.max_turns, self.sandbox_backend
        return f"<PythonToolEnv problems={n} max_turns={turns} backend={backend}>"
