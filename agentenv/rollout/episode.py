"""The agent loop: one coroutine per episode, token in and token out.

``run_episode`` plays one episode: reset the environment, render the first observation with the
chat template, then alternate engine generation and environment steps until the episode is
terminated, truncated, or out of its turn or token budget. The trajectory keeps the exact ids the
engine conditioned on and produced; observations are appended as template-rendered token deltas,
never by re-tokenizing decoded model text. Failures are recorded on the trajectory instead of
raised, so one broken episode never stops a run.

With a renderer that keeps the conversation (``ChatRenderer.conversation``), each observation is
rendered against the episode's real history, and a template that does not render that history as
the model saw it (Qwen3's) is handled by ``RolloutConfig.on_prefix_violation``: ``"append"`` keeps
one row, ``"split"`` starts a new per-turn sample (:func:`run_episode_samples` returns them all).
Either way ``info["prefix_violations"]`` counts the turns where it happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from agentenv.core import Env
from agentenv.engines.base import GenerationEngine, GenerationOutput, SamplingParams, derive_seed
from agentenv.errors import ConfigError, EngineError, EngineRebuilt, TemplateError
from agentenv.trajectory import Trajectory

if TYPE_CHECKING:
    from agentenv.rollout.chat import Conversation

logger = logging.getLogger(__name__)


class Renderer(Protocol):
    """What the loop needs from the chat renderer (``agentenv.rollout.chat.ChatRenderer``).

    A renderer class that subclasses this protocol inherits the defaults of :attr:`end_of_turn_id`
    and :attr:`tool_parser_name`; ``ChatRenderer`` reads both from its template.
    """

    stop_token_ids: tuple[int, ...]

    @property
    def end_of_turn_id(self) -> int:
        """The token that closes an assistant turn (a reply cut by a token budget is closed with it).

        Default: the first of :attr:`stop_token_ids`.
        """
        return self.stop_token_ids[0]

    @property
    def tool_parser_name(self) -> str | None:
        """The registered tool-call parser the chat template implies (:mod:`agentenv.rollout.tool_calls`), or None.

        None (the default) means the template implies none: callers then parse Hermes calls.
        """
        return None

    def initial_prompt(self, user_text: str, *, system: str | None = None, tools: Any = ()) -> list[int]:
        """Token ids of the first prompt, ending with the assistant generation prompt."""
        ...

    def observation_tokens(self, role: str, content: str) -> list[int]:
        """Token ids appended after a finished assistant turn: the message, then the next assistant prompt."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of sampled ids for the environment (special tokens dropped)."""
        ...


@runtime_checkable
class ConversationRenderer(Renderer, Protocol):
    """A renderer that also renders whole conversations (``agentenv.rollout.chat.ChatRenderer``): the exact path.

    With one, an episode's tokens are the chat template applied to the whole message history; a plain
    :class:`Renderer` appends each observation's tokens to the previous ones instead.
    """

    def conversation(self, user_text: str, *, system: str | None = None,
                     tools: Any = ()) -> Conversation:
        """Start one episode's :class:`agentenv.rollout.chat.Conversation` from the task's first observation."""
        ...


@runtime_checkable
class EpisodePlayer(Protocol):
    """An environment that plays whole episodes itself, calling the model (:class:`agentenv.agents.env.AgentEnv`).

    :func:`run_episode_samples` hands such an env the engine, renderer and config instead of
    alternating generation and ``step``.
    """

    async def play_episode(self, engine: GenerationEngine, renderer: Renderer, cfg: RolloutConfig, *,
                           seed: int | None = None, options: Mapping[str, Any] | None = None,
                           version_fn: Callable[[], int] | None = None) -> list[Trajectory]:
        """Play one episode; return its samples, scored (``status="error"`` rather than raising)."""
        ...


@dataclass(frozen=True)
class RolloutConfig:
    """Budgets and sampling of one episode.

    Attributes:
        max_turns: Assistant turns per episode; the episode is truncated after this many.
        max_new_tokens_per_turn: Sampled tokens per assistant turn (tokens).
        max_total_tokens: Policy plus observation tokens after the first prompt (tokens); the
            episode is truncated when the budget is spent.
        temperature: Sampling temperature (the paper's default is 1); 0 decodes greedily, which is
            for evaluation only (training needs the sampled distribution's log-probabilities).
        top_p: Nucleus mass in (0, 1] (the paper's default is 1).
        top_k: Keep only the k most likely tokens before top-p (k >= 1); None or 0 is off (the
            default); a negative value raises ``ConfigError``.
        episode_deadline_s: Wall-clock budget of a whole episode (seconds: reset, generation and
            environment steps); None (the default) takes the environment's declared
            ``episode_deadline_s`` (every shipped env declares one; an env without it has none).
            An episode past it is a *straggler*.
        turn_deadline_s: Wall-clock budget of one assistant turn's generation (seconds); None is
            none. A turn past it is cancelled in the engine (its partial tokens are dropped).
        on_deadline: What a straggler becomes when the deadline passed during generation.
            ``"truncate"`` (default): the episode ends where it is, keeping the turns it finished
            and the reward it has (``info["truncation"] = "deadline"``); ``"requeue"``: the episode
            fails (status ``"error"``), so the collector replays its task (a bounded number of
            times) and it never enters a batch. A deadline that passes inside ``env.reset`` or
            ``env.step`` (the environment stalled) always requeues: it is never scored. Either way
            ``info["straggler"]`` names what ran out (``"turn"``, ``"episode"``) and
            ``info["deadline_in"]`` where (``"env"``, ``"generation"``).
        on_prefix_violation: What happens when the chat template does not render the real history
            as the model conditioned on it (``agentenv.rollout.chat``; Qwen3 drops earlier ``<think>``
            blocks): ``"append"`` (default) keeps the conditioned ids and appends the observation
            rendered against the real history (one row per episode); ``"split"`` ends the sample at
            that reply and starts a new one whose prompt is the template's rendering of the real
            history (several rows per episode, each exactly what the template renders, all with the
            episode's reward). Counted in ``info["prefix_violations"]`` either way.
    """

    max_turns: int = 4
    max_new_tokens_per_turn: int = 256
    max_total_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    episode_deadline_s: float | None = None
    turn_deadline_s: float | None = None
    on_deadline: Literal["truncate", "requeue"] = "truncate"
    on_prefix_violation: Literal["append", "split"] = "append"

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_new_tokens_per_turn < 1 or self.max_total_tokens < 1:
            raise ConfigError("token budgets must be >= 1")
        if not 0 <= self.temperature < float("inf"):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        from agentenv.engines.sampling import check_top_k  # the engines' own rule for top_k

        check_top_k(self.top_k)
        for name in ("episode_deadline_s", "turn_deadline_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise ConfigError(f"rollout.{name} must be a number of seconds > 0 or null, got {value!r}")
        if self.on_deadline not in ("truncate", "requeue"):
            raise ConfigError(f"rollout.on_deadline must be 'truncate' or 'requeue', got {self.on_deadline!r}")
        if self.on_prefix_violation not in ("append", "split"):
            raise ConfigError(
                f"rollout.on_prefix_violation must be 'append' or 'split', got {self.on_prefix_violation!r}"
            )

    @property
    def policy_token_budget(self) -> int:
        """The most policy tokens one trajectory can hold (tokens).

        ``min(max_turns * max_new_tokens_per_turn, max_total_tokens)``: every reply counts against both budgets.
        """
        return min(self.max_turns * self.max_new_tokens_per_turn, self.max_total_tokens)


#: Turn endings that are token-budget cuts: the reply stopped before its end-of-turn token.
TOKEN_BUDGET_ENDINGS = frozenset({"max_new_tokens_per_turn", "max_total_tokens", "context"})


def turn_ending(out: GenerationOutput, stop_token_ids: tuple[int, ...], *, budget: int, per_turn: int,
                context_left: int) -> str:
    """Why one assistant turn ended.

    Args:
        out: The engine's output for the turn.
        stop_token_ids: The renderer's end-of-turn ids.
        budget: Tokens the turn was allowed (tokens): the smallest of the three budgets below.
        per_turn: ``max_new_tokens_per_turn`` (tokens).
        context_left: Room left in the model's context when the turn started (tokens).

    Returns:
        ``"end_of_turn"`` (the reply sampled its end-of-turn token), ``"stop"`` (the engine stopped
        it otherwise), or the budget that cut it: ``"context"``, ``"max_new_tokens_per_turn"`` or
        ``"max_total_tokens"`` (see :data:`TOKEN_BUDGET_ENDINGS`).
    """
    if out.token_ids and out.token_ids[-1] in stop_token_ids:
        return "end_of_turn"
    if out.finish_reason == "stop":
        return "stop"
    if out.truncated_context or budget >= context_left:
        return "context"
    return "max_new_tokens_per_turn" if budget >= per_turn else "max_total_tokens"


def is_token_budget_cut(traj: Trajectory) -> bool:
    """Whether a token budget (per turn, total or context) ended ``traj`` (see ``info["truncation"]``)."""
    return traj.info.get("truncation") in TOKEN_BUDGET_ENDINGS


_T = TypeVar("_T")


class _DeadlineHit(Exception):
    """A turn or the episode ran past its wall-clock deadline.

    ``what``: ``"turn"`` or ``"episode"``; ``inside``: where it passed, ``"env"`` (in ``env.reset``
    or ``env.step``: the environment stalled) or ``"generation"``.
    """

    def __init__(self, what: str, seconds: float, inside: str) -> None:
        super().__init__(f"{what} deadline of {seconds:g} s passed in {inside}")
        self.what = what
        self.inside = inside


def episode_deadline(cfg: RolloutConfig, env: Env) -> float | None:
    """The episode's deadline in seconds: ``cfg.episode_deadline_s``, else the env's declared one.

    An environment declares its default as an ``episode_deadline_s`` attribute (seconds, a stated
    multiple of its expected episode time; the shipped ones all do); None: no deadline.
    """
    if cfg.episode_deadline_s is not None:
        return cfg.episode_deadline_s
    return env.episode_deadline_s


class _Clock:
    """The deadlines of one episode: ``episode_s`` (:func:`episode_deadline`), ``cfg.turn_deadline_s``."""

    def __init__(self, cfg: RolloutConfig, episode_s: float | None) -> None:
        self.cfg = cfg
        self.episode_s = episode_s
        self.end = None if episode_s is None else time.monotonic() + episode_s

    async def within(self, call: Awaitable[_T], *, turn: bool = False) -> _T:
        """Await ``call`` until the episode's (and for a turn, the turn's) deadline; cancel it after.

        ``turn``: ``call`` generates an assistant turn; else it is an environment call (reset, step).

        Raises:
            _DeadlineHit: The deadline passed first (``call`` was cancelled).
        """
        limits = []
        if self.end is not None:
            limits.append((self.end - time.monotonic(), "episode", self.episode_s))
        if turn and self.cfg.turn_deadline_s is not None:
            limits.append((self.cfg.turn_deadline_s, "turn", self.cfg.turn_deadline_s))
        if not limits:
            return await call
        left, what, seconds = min(limits)
        try:
            return await asyncio.wait_for(call, timeout=max(left, 0.0))
        except TimeoutError:
            raise _DeadlineHit(what, seconds, "generation" if turn else "env") from None


def append_output(traj: Trajectory, out: GenerationOutput) -> None:
    """Append an engine output to ``traj`` as policy tokens, one segment piece per version span.

    Raises:
        EngineError: The output has no version spans, or they do not cover its tokens.
    """
    if not out.spans:
        raise EngineError("engine returned tokens without version spans")
    pos = 0
    for span in out.spans:
        end = pos + span.num_tokens
        traj.append_policy_tokens(out.token_ids[pos:end], out.logprobs[pos:end], span.version, span.prefix_version)
        pos = end
    if pos != len(out.token_ids):
        raise EngineError(f"version spans cover {pos} of {len(out.token_ids)} tokens")


async def run_episode(
    env: Env,
    engine: GenerationEngine,
    renderer: Renderer,
    cfg: RolloutConfig,
    *,
    seed: int | None = None,
    options: Mapping[str, Any] | None = None,
    version_fn: Callable[[], int] | None = None,
    sampling_seed: int | None = None,
) -> Trajectory:
    """Play one episode and return its last sample (a :class:`~agentenv.trajectory.Trajectory`).

    The episode's last sample: the only one unless ``cfg.on_prefix_violation == "split"`` split it
    (then ``info["samples"]`` says how many there were; :func:`run_episode_samples` returns them all).
    Arguments and result as :func:`run_episode_samples`.
    """
    samples = await run_episode_samples(env, engine, renderer, cfg, seed=seed, options=options,
                                        version_fn=version_fn, sampling_seed=sampling_seed)
    if len(samples) > 1 and not _warned_split:
        _warn_split(len(samples))
    return samples[-1]


_warned_split = False


def _warn_split(n: int) -> None:
    global _warned_split
    _warned_split = True
    logger.warning("rollout.on_prefix_violation='split' made %d samples of one episode; run_episode returns "
                   "the last only (run_episode_samples returns them all)", n)


async def run_episode_samples(
    env: Env,
    engine: GenerationEngine,
    renderer: Renderer,
    cfg: RolloutConfig,
    *,
    seed: int | None = None,
    options: Mapping[str, Any] | None = None,
    version_fn: Callable[[], int] | None = None,
    sampling_seed: int | None = None,
) -> list[Trajectory]:
    """Play one episode and return its samples (one :class:`~agentenv.trajectory.Trajectory` each).

    An environment with a ``play_episode`` method drives the model itself (an agent program behind
    an OpenAI-compatible endpoint, :class:`agentenv.agents.AgentEnv`): it is called with these
    arguments and its samples are returned as they are.

    Args:
        env: A fresh or reusable environment (it is reset here, not closed).
        engine: Generates the policy tokens and reports their versions.
        renderer: Chat template renderer of the engine's tokenizer.
        cfg: Budgets and sampling settings.
        seed: Passed to ``env.reset``; picks the task reproducibly.
        options: Passed to ``env.reset``.
        version_fn: Returns the learner's current policy version (start and completion versions);
            defaults to the engine's version.
        sampling_seed: Seeds the episode's sampling: turn ``k`` (0-based, counted over the whole
            episode) is generated with the request seed ``derive_seed(sampling_seed, k)``, so the
            episode's tokens depend on this seed and the weights only, not on the other requests in
            the engine's batch. None: every turn draws from the engine's shared generator.

    Returns:
        The samples in order: one, unless ``cfg.on_prefix_violation == "split"`` started new ones
        (each then has the episode's reward, ``info["sample"]`` its index and ``info["samples"]``
        the count). ``status`` is ``"error"`` (with ``info["error"]``) when the environment or
        the engine raised; ``info["truncation"]`` names the budget that cut the episode, if any;
        ``info["turns"]`` counts assistant turns and ``info["turn_endings"]`` says how each turn
        ended (:func:`turn_ending`, or ``"deadline"``). A turn cut by a token budget is handed to the
        environment only when ``env.cut_turn == "act"`` (:class:`agentenv.core.Env`). A deadline
        (``cfg.episode_deadline_s``, ``cfg.turn_deadline_s``) ends the episode as ``cfg.on_deadline``
        says, with ``info["straggler"]`` set. ``info["prefix_violations"]`` counts observations the
        template could not render as an exact continuation (``cfg.on_prefix_violation``). This
        function does not raise for those.
    """
    if isinstance(env, EpisodePlayer):  # the env drives the model (agentenv.agents)
        return await env.play_episode(engine, renderer, cfg, seed=seed, options=options, version_fn=version_fn)
    if sampling_seed is not None and (isinstance(sampling_seed, bool) or not isinstance(sampling_seed, int)):
        raise TypeError(f"sampling_seed must be an int or None, got {sampling_seed!r}")
    current_version = version_fn or (lambda: engine.version)
    traj = Trajectory(start_version=current_version(), start_time=time.time())
    info: dict[str, Any] = {"turns": 0, "truncation": None, "turn_endings": [], "prefix_violations": 0}
    cut_turn = env.cut_turn
    clock = _Clock(cfg, episode_deadline(cfg, env))
    samples: list[Trajectory] = []  # earlier samples of a split episode
    conv = None
    reward = 0.0
    used_before = 0  # budget tokens spent in earlier samples
    try:
        if cut_turn not in ("end", "act"):
            raise ConfigError(f"{type(env).__name__}.cut_turn must be 'end' or 'act', got {cut_turn!r}")
        obs, reset_info = await clock.within(env.reset(seed=seed, options=options))
        info.update(reset_info)
        traj.task_id = str(reset_info.get("task_id", seed))
        if isinstance(renderer, ConversationRenderer):  # the exact, history-aware path (agentenv.rollout.chat)
            conv = renderer.conversation(obs, system=env.system_prompt, tools=list(env.tools))
            prompt = list(conv.prompt_ids)
        else:
            prompt = renderer.initial_prompt(obs, system=env.system_prompt, tools=list(env.tools))
        traj.append_environment_tokens(prompt)
        traj.prompt_length = len(prompt)
        generated_budget_start = len(traj.token_ids)
        while True:
            used = used_before + len(traj.token_ids) - generated_budget_start
            context_left = engine.max_context_tokens - len(traj.token_ids)
            budget = min(cfg.max_new_tokens_per_turn, cfg.max_total_tokens - used, context_left)
            if budget <= 0:
                info["truncation"] = "context" if context_left <= 0 else "max_total_tokens"
                break
            params = SamplingParams(
                max_new_tokens=budget,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
                stop_token_ids=tuple(renderer.stop_token_ids),
                seed=None if sampling_seed is None else derive_seed(sampling_seed, info["turns"]),
            )
            try:
                out = await clock.within(engine.generate(traj.token_ids, params), turn=True)
            except _DeadlineHit:
                info["turn_endings"].append("deadline")
                raise
            append_output(traj, out)
            info["turns"] += 1
            ending = turn_ending(out, renderer.stop_token_ids, budget=budget, per_turn=cfg.max_new_tokens_per_turn,
                                 context_left=context_left)
            info["turn_endings"].append(ending)
            cut = ending in TOKEN_BUDGET_ENDINGS
            if cut and cut_turn == "end":
                info["truncation"] = ending  # never graded: the episode keeps the reward it has
                break
            reply = conv.add_reply(out.token_ids) if conv is not None else renderer.decode(out.token_ids)
            result = await clock.within(env.step(reply))
            reward += float(result.reward)
            info.update(result.info)
            if result.terminated or result.truncated:
                if result.truncated:
                    info["truncation"] = "env"
                if cut:
                    info["truncation"] = ending
                break
            if cut and ending != "max_new_tokens_per_turn":
                info["truncation"] = ending  # no token budget left for another turn
                break
            if info["turns"] >= cfg.max_turns:
                info["truncation"] = "max_turns"
                break
            # A cut turn ("act") is closed with the end-of-turn token, as an environment token: the
            # policy did not sample it, and the template's delta assumes a closed turn.
            closing = [renderer.end_of_turn_id] if cut else []
            if conv is None:
                obs_ids = closing + renderer.observation_tokens(env.observation_role, result.observation)
            else:
                delta = conv.observe(env.observation_role, result.observation, policy=cfg.on_prefix_violation)
                info["prefix_violations"] += not delta.prefix_ok
                if delta.restart:  # "split": this sample ends at the reply; the next one re-renders
                    if len(delta.ids) >= engine.max_context_tokens:
                        info["truncation"] = "context"
                        break
                    traj.append_environment_tokens(closing)
                    used_before += len(traj.token_ids) - generated_budget_start
                    used_before += max(0, len(delta.ids) - len(traj.token_ids))  # the new observation
                    samples.append(traj)
                    traj = Trajectory(start_version=current_version(), start_time=time.time(), task_id=traj.task_id)
                    traj.append_environment_tokens(delta.ids)
                    traj.prompt_length = generated_budget_start = len(delta.ids)
                    continue
                obs_ids = closing + delta.ids
            if len(traj.token_ids) + len(obs_ids) >= engine.max_context_tokens:
                info["truncation"] = "context"
                break
            traj.append_environment_tokens(obs_ids)
    except _DeadlineHit as exc:
        info["truncation"], info["straggler"], info["deadline_in"] = "deadline", exc.what, exc.inside
        # a stalled environment is never scored: its episode fails and the collector replays the task
        if cfg.on_deadline == "requeue" or exc.inside == "env":
            traj.status = "error"
            info["error"] = f"straggler: {exc}"
        handling = "requeue" if traj.status == "error" else cfg.on_deadline
        logger.info("episode %s: %s (%s)", traj.id, exc, handling)
    except (EngineError, TemplateError) as exc:
        traj.status = "error"
        info["error"] = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, EngineRebuilt):  # not the episode's failure: its task is replayed
            info["requeue"] = True
        logger.warning("episode %s failed: %s", traj.id, info["error"])
    except Exception as exc:  # an environment that raises ends only its own episode
        traj.status = "error"
        info["error"] = f"{type(exc).__name__}: {exc}"
        logger.warning("episode %s: environment raised %s", traj.id, info["error"])
    samples.append(traj)
    for i, sample in enumerate(samples):
        sample.reward = reward
        sample.status = traj.status
        sample.completion_version = current_version()
        sample.completion_time = time.time()
        sample.info = info if len(samples) == 1 else {**info, "sample": i, "samples": len(samples)}
    return samples
