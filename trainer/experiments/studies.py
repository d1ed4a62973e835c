"""The studies of ``agentenv study``: each claim of the two papers as settings of one recipe.

A :class:`Study` is data: its settings are config overrides over one base task (:data:`BASE_RECIPE`
with :data:`BASE_OVERRIDES`), its budget is the same number of updates (and so, with the same
``run.batch_size``, the same rollouts) or the same wall-clock seconds, and ``figures`` names the
table columns (:data:`FIGURES`) that carry the claim. A study that needs a mechanism agentenv does not
have yet carries ``not_runnable`` (the reason); ``agentenv study`` lists it and refuses to run it.
The claims: docs/studies.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BASE_OVERRIDES", "BASE_RECIPE", "FIGURES", "QUICK_OVERRIDES", "SEED_SPREAD", "STUDIES", "WALL_CLOCK_S",
    "Expectation", "Setting", "Study", "budget",
]

#: The task every study trains on: the CPU default on integer-expression problems.
BASE_RECIPE = "python_tool_cpu"
BASE_OVERRIDES = ("env.kwargs.dataset=tool_expr_train", "env.eval_kwargs.dataset=tool_expr_eval")
#: ``--quick``: a couple of updates of B = 4 with short replies and 4 held-out problems (minutes on 2 cores).
QUICK_OVERRIDES = ("warmup.steps=1", "run.batch_size=4", "run.concurrency=4", "run.max_pool_size=8",
                   "rollout.max_new_tokens_per_turn=24", "rollout.max_total_tokens=96",
                   "env.kwargs.sandbox_backend=process", "eval.problems=4", "eval.concurrency=4",
                   "optim.step_on_zero_gradient=true")
QUICK_UPDATES = 2
#: The wall-clock studies' budget per setting (seconds of the update loop; model load, warm-up cache
#: and the held-out evaluations are outside it): about a third of the default recipe's 24 updates on
#: the idle 2-core VM. With the evaluation after the budget (about 6 minutes for 200 problems)
#: and the model load, the two studies' ten settings take about 170 minutes.
WALL_CLOCK_S = 600.0
QUICK_SECONDS = 90.0
#: One run's spread: the standard deviation of held-out success after training over seeds of one config
#: (fraction; the evaluation's own noise included), from which ``agentenv study --seeds auto`` sizes a study.
#: The default recipe over five seeds: 0.083 (docs/stability.md, "The default: 24 updates at a peak of 1.5e-5").
SEED_SPREAD = 0.083

#: Table column -> what it is (study.md's legend). Rates get a 95% interval.
FIGURES: dict[str, str] = {
    "success_after": "held-out success after training (fraction of tasks; 95% Wilson interval)",
    "success_before": "held-out success before training (the same tasks)",
    "tool_calls": "tool calls per trajectory, mean of the last 5 updates' batches",
    "tool_calls_after": "tool calls per held-out episode after training",
    "reward_last5": "training reward, mean of the last 5 updates",
    "reward_std": "standard deviation of the training reward over updates (stability)",
    "response_tokens": "policy tokens per trajectory, mean over updates",
    "truncated": "share of trajectories a token budget ended (per turn, total or context), mean over updates",
    "turns": "assistant turns per trajectory, mean over updates",
    "failed_tokens": "policy tokens per failed trajectory (reward <= 0), mean over those consumed at the last 5 "
                     "policy versions",
    "admitted": "gate admission rate (mean over updates of learner/admitted_fraction: rows with an admitted token)",
    "admitted_tokens": "share of policy tokens the gate admits (mean over updates of learner/admitted_token_fraction)",
    "rho_truncated": "share of policy tokens whose importance ratio objective.is_truncation capped (mean over "
                     "updates of learner/rho_truncated_fraction; n/a without the option)",
    "mean_d": "mean Bernoulli-KL proxy D over the batch's rows, admitted or not (nats; learner/mean_d)",
    "lag_mean": "mean token-averaged staleness S = GS + WS of consumed trajectories (versions)",
    "gs_mean": "mean generation staleness GS of consumed trajectories (versions)",
    "ws_mean": "mean waiting staleness WS of consumed trajectories (versions)",
    "rejection_rate": "rejected / (rejected + consumed) trajectories",
    "gain": "held-out success after minus before, over the same tasks (paired-bootstrap 95% interval)",
    "vs_first": "held-out success after minus the first setting's after, over the same tasks "
                "(paired-bootstrap 95% interval; one that contains 0 shows no difference)",
}


@dataclass(frozen=True)
class Setting:
    """One arm of a study: a name and the config overrides (``section.field=value``) that make it."""

    name: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Expectation:
    """What the claim says one setting does against another, on one figure: the rule a study decides by.

    Attributes:
        setting: The setting the claim is about.
        reference: The setting it is compared with (the same seeds: paired by seed, and by task for
            held-out success).
        direction: ``"higher"`` or ``"lower"`` (the claim's sign), or ``"not_lower"`` (it matches the
            reference: no worse than the study's stated effect).
        figure: A key of :data:`FIGURES` measured once per run; ``"success_after"`` (the default)
            is compared over seeds and held-out tasks.
    """

    setting: str
    reference: str
    direction: Literal["higher", "lower", "not_lower"]
    figure: str = "success_after"


@dataclass(frozen=True)
class Study:
    """One claim, its settings and its budget.

    Attributes:
        name: The study's command-line name.
        claim: The paper's claim, in one line (study.md quotes it).
        settings: The arms; ``--quick`` runs the first two.
        figures: Table columns (keys of :data:`FIGURES`); the first is the study's own plot.
        updates: Equal-updates budget per setting; None: the base recipe's ``run.updates``. Under
            ``seconds`` it is the lr schedule's horizon and an upper bound that no setting reaches
            within the budget on the 2-core VM (sync 5, async 7-9 updates in 600 s).
        seconds: Equal wall-clock budget per setting (update-loop seconds), or None.
        not_runnable: Why the study cannot run yet, or None.
        extra: Overrides for every setting of this study (over the base task).
        expect: What the claim predicts, setting against setting (:class:`Expectation`): with
            ``--seeds K`` each becomes "reproduced", "contradicted" or "undecided at this scale".
    """

    name: str
    claim: str
    settings: tuple[Setting, ...]
    figures: tuple[str, ...]
    updates: int | None = None
    seconds: float | None = None
    not_runnable: str | None = None
    extra: tuple[str, ...] = ()
    expect: tuple[Expectation, ...] = ()


def _s(name: str, *overrides: str) -> Setting:
    return Setting(name, tuple(overrides))


#: The staleness policies compared at equal wall-clock (with and without tool latency).
_WALL_CLOCK_SETTINGS = (
    _s("sync", "staleness.policy=sync"),
    _s("async_none", "staleness.policy=none"),
    _s("async_max_lag", "staleness.policy=max_lag"),
    _s("pace_token_share", "staleness.policy=pace", "staleness.drift_mode=token_share"),
    _s("pace_scoring", "staleness.policy=pace", "staleness.drift_mode=scoring"),
)
_WALL_CLOCK_FIGURES = ("success_after", "reward_last5", "gs_mean", "ws_mean", "rejection_rate")


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("one_vs_group",
          "FlashREINFORCE (one rollout per prompt) keeps calling the tool where GRPO (groups) stops; "
          "better held-out success with the same rollouts",
          (_s("flash_reinforce_n1", "objective.name=flash_reinforce"),
           _s("grpo_n4", "objective.name=grpo", "objective.grpo_group_size=4")),
          ("tool_calls", "success_after", "tool_calls_after", "reward_last5"),
          expect=(Expectation("grpo_n4", "flash_reinforce_n1", "lower"),
                  Expectation("grpo_n4", "flash_reinforce_n1", "lower", "tool_calls_after"))),
    Study("signed_feedback",
          "With negative feedback removed (A = max(A, 0)) tool calls vanish; the full batch-mean baseline keeps them",
          (_s("full_baseline", "objective.advantage_clip_negative=false"),
           _s("positive_only", "objective.advantage_clip_negative=true")),
          ("tool_calls", "success_after", "tool_calls_after", "reward_last5"),
          expect=(Expectation("positive_only", "full_baseline", "lower", "tool_calls_after"),
                  Expectation("positive_only", "full_baseline", "lower"))),
    Study("sample_vs_token_mean",
          "Sample-mean (each trajectory's tokens over its T_i, then over B) against token-mean (1/N per token): "
          "response length, truncation rate, tool calls, success",
          (_s("sample_mean", "objective.loss_aggregation=sample_mean"),
           _s("token_mean", "objective.loss_aggregation=token_mean")),
          ("response_tokens", "truncated", "tool_calls", "success_after", "tool_calls_after"),
          expect=(Expectation("token_mean", "sample_mean", "lower"),)),
    Study("gate_under_lag",
          "Under a forced policy lag >= 4 the sequence-level gate keeps the train-inference mismatch low "
          "and the reward stable, against a token-local mask, no gate, and no gate with the importance "
          "ratio truncated at 2",
          (_s("sequence_gate", "objective.gate=sequence"), _s("token_mask", "objective.gate=token"),
           _s("no_gate", "objective.gate=none"),
           _s("no_gate_tis", "objective.gate=none", "objective.is_truncation=2.0")),
          ("mean_d", "reward_std", "admitted", "admitted_tokens", "lag_mean", "success_after", "rho_truncated"),
          # the engine serves the learner's weights 4 versions late; policy none keeps every lagged trajectory
          extra=("staleness.forced_lag=4", "staleness.policy=none"),
          expect=(Expectation("token_mask", "sequence_gate", "lower"), Expectation("no_gate", "sequence_gate", "lower"),
                  Expectation("no_gate", "sequence_gate", "higher", "mean_d"),
                  Expectation("no_gate_tis", "sequence_gate", "lower"))),
    Study("staleness_wall_clock",
          "At equal wall-clock PACE beats unfiltered async and matches sync in less time",
          _WALL_CLOCK_SETTINGS, _WALL_CLOCK_FIGURES,
          # the held-out evaluation after the budget is not part of it
          seconds=WALL_CLOCK_S,
          expect=(Expectation("pace_token_share", "async_none", "higher"),
                  Expectation("pace_token_share", "sync", "not_lower"))),
    Study("staleness_wall_clock_latency",
          "With long-tailed tool latency (multi-turn tool use) PACE beats both unfiltered async and sync "
          "at equal wall-clock",
          _WALL_CLOCK_SETTINGS, _WALL_CLOCK_FIGURES,
          # every tool step waits a lognormal delay: median 2 s, 99th percentile ~20 s, mean 3.3 s
          # (not the held-out episodes: their success measures the policy, not the tool's speed)
          seconds=WALL_CLOCK_S, extra=("env.step_latency.median_s=2.0", "env.step_latency.sigma=1.0"),
          expect=(Expectation("pace_token_share", "async_none", "higher"),
                  Expectation("pace_token_share", "sync", "higher"))),
    Study("loss_normaliser",
          "Dividing each trajectory by its own length (sample mean) weighs a long failed trajectory's tokens "
          "less than a short one's; one constant normaliser (AsyncWebRL, arXiv 2606.05597) corrects every "
          "token alike, so on a multi-turn task failed trajectories get shorter (fewer turns and token-budget "
          "cuts) without losing held-out success",
          (_s("sample_mean", "objective.loss_aggregation=sample_mean"),
           _s("constant", "objective.loss_aggregation=constant")),
          ("failed_tokens", "turns", "truncated", "response_tokens", "success_after", "tool_calls", "reward_last5"),
          # up to 4 replies: a failure can be one wrong answer or a run of broken tool calls to the turn limit;
          # the constant is the policy-token budget per trajectory, min(4 x 96, 512) = 384
          extra=("env.kwargs.max_turns=4", "rollout.max_turns=4", "rollout.max_total_tokens=512"),
          expect=(Expectation("constant", "sample_mean", "lower", "failed_tokens"),
                  Expectation("constant", "sample_mean", "not_lower"))),
    Study("entropy_filter",
          "Keeping only the ceil(0.9 T) highest-entropy tokens of failed trajectories against no filter",
          (_s("no_filter", "objective.entropy_keep_fraction=null"),
           _s("keep_0.9", "objective.entropy_keep_fraction=0.9")),
          ("success_after", "tool_calls", "reward_last5"),
          expect=(Expectation("keep_0.9", "no_filter", "higher"),)),
)}


def budget(study: Study, quick: bool) -> tuple[int | None, float | None]:
    """``(updates, seconds)`` per setting: equal updates, or equal wall-clock seconds.

    ``updates`` None is the base recipe's ``run.updates``: the lr schedule's horizon (a wall-clock
    setting keeps it, so that its warm-up and decay are the default's, and stops when its seconds are
    spent).
    """
    if study.seconds is not None:
        return study.updates, QUICK_SECONDS if quick else study.seconds
    return (QUICK_UPDATES if quick else study.updates), None
