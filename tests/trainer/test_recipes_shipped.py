"""Every shipped recipe loads into TrainConfig by name and holds the values it claims; the learner
section is typed and checked (fast: no model, no process group)."""

from __future__ import annotations

import pytest

from agentenv.errors import ConfigError
from agentenv.trainer.recipe import parse_args, resolve_recipe
from agentenv.trainer.recipe_files import RECIPES_DIR

SHIPPED = {"python_tool_cpu", "alfworld_cpu", "python_tool_qwen2.5_7b", "alfworld_qwen2.5_7b", "generic_cpu",
           "python_tool_qwen2.5_7b_lora"}


def test_every_shipped_recipe_loads_by_name():
    found = {p.stem for p in RECIPES_DIR.glob("*.yaml")}
    assert found == SHIPPED
    for name in sorted(found - {"generic_cpu"}):
        assert resolve_recipe(name) == RECIPES_DIR / f"{name}.yaml"
        cfg, _ = parse_args(["--recipe", name])
        assert cfg.env.id == name.split("_cpu")[0].split("_qwen")[0]
        assert cfg.run.run_dir == f"runs/{name}"


@pytest.mark.parametrize("name, limit, value", [
    ("python_tool_cpu", "max_turns", 2), ("python_tool_qwen2.5_7b", "max_turns", 8),
    ("alfworld_cpu", "max_steps", 4), ("alfworld_qwen2.5_7b", "max_steps", 50)])
def test_env_turn_limits_are_the_rollout_limits_and_held_out_sets_are_env_arguments(name, limit, value):
    cfg, _ = parse_args(["--recipe", name])
    assert cfg.env.kwargs[limit] == cfg.rollout.max_turns == value
    key = "dataset" if cfg.env.id == "python_tool" else "split"
    assert cfg.env.kwargs[key] != cfg.env.eval_kwargs[key] and set(cfg.env.eval_kwargs) == {key}


def test_the_generic_recipe_assumes_nothing_about_the_env():
    cfg, _ = parse_args(["--recipe", "generic_cpu", "--env", "alfworld"])
    assert cfg.env.id == "alfworld" and cfg.env.kwargs == {} and cfg.env.eval_kwargs == {}
    assert cfg.warmup.steps == 0 and cfg.eval.problems == 0 and cfg.model.name is None
    assert cfg.run.run_dir == "runs/alfworld"  # named after the env: two envs never share a run folder
    cfg, _ = parse_args(["--env", "reasoning_gym_tool/gcd"])  # a peer's id: the generic recipe, chosen for it
    assert (cfg.env.id, cfg.run.run_dir) == ("reasoning_gym_tool/gcd", "runs/reasoning_gym_tool_gcd")
    cfg, _ = parse_args(["--env", "reasoning_gym/gcd", "--run-dir", "elsewhere"])
    assert cfg.run.run_dir == "elsewhere"


def test_removed_env_fields_are_unknown_fields():
    for field in ("dataset", "eval_dataset", "max_problem_chars"):
        with pytest.raises(ConfigError, match=rf"env: unknown field\(s\) \['{field}'\]"):
            parse_args([f"env.{field}=x"])


def test_env_picks_its_cpu_recipe_and_alfworld_has_no_warmup():
    cfg, _ = parse_args(["--env", "alfworld"])
    assert cfg.env.id == "alfworld" and cfg.env.kwargs["split"] == "train" and cfg.warmup.steps == 0
    assert cfg.model.name is None and cfg.model.engine == "transformers" and cfg.learner.backend == "single"
    assert cfg.objective.entropy_keep_fraction == 0.9


@pytest.mark.parametrize("name, batch, entropy", [("python_tool_qwen2.5_7b", 128, None),
                                                   ("alfworld_qwen2.5_7b", 64, 0.9)])
def test_gpu_recipes_mirror_the_papers(name, batch, entropy):
    cfg, _ = parse_args(["--recipe", name])
    o, objective = cfg.optim, cfg.objective
    assert (objective.name, o.lr, o.weight_decay, o.grad_clip) == ("flash_reinforce", 1e-6, 0.1, 1.0)
    assert objective.delta == 1e-3
    assert objective.entropy_keep_fraction == entropy and cfg.run.batch_size == batch
    assert (cfg.rollout.temperature, cfg.rollout.top_p) == (1.0, 1.0)
    s = cfg.staleness
    assert (s.policy, s.drift_mode, s.gamma, s.beta) == ("pace", "scoring", 4.0, 0.9)
    assert s.target_occupancy is None  # N_target = B
    assert cfg.model.engine == "vllm" and cfg.warmup.steps == 0
    assert (cfg.learner.backend, cfg.learner.param_dtype, cfg.learner.zero_stage) == ("ray", "bf16", 2)
    assert batch % (cfg.learner.micro_batch_size * cfg.learner.world_size) == 0
    # every value stays overridable from the command line
    cfg, _ = parse_args(["--recipe", name, "--learner.world_size", "2", "--optim.lr", "3e-6"])
    assert (cfg.learner.world_size, cfg.optim.lr) == (2, 3e-6)


def test_the_lora_recipe_changes_the_learner_only():
    """The 7B LoRA recipe is the 7B recipe's task, rollout, PACE and gate, with adapters on the single learner."""
    full, _ = parse_args(["--recipe", "python_tool_qwen2.5_7b"])
    lora, _ = parse_args(["--recipe", "python_tool_qwen2.5_7b_lora"])
    for section in ("env", "rollout", "staleness", "objective", "warmup", "eval"):
        assert getattr(lora, section) == getattr(full, section), section
    assert (lora.run.batch_size, lora.run.updates) == (full.run.batch_size, full.run.updates) == (128, 500)
    assert lora.optim.lr == 1e-5 == pytest.approx(10 * full.optim.lr)  # LoRA Without Regret: about 10x the full lr
    assert lora.optim.weight_decay == full.optim.weight_decay and lora.optim.grad_clip == full.optim.grad_clip
    le = lora.learner
    assert (le.backend, le.lora_rank, le.lora_alpha, le.lora_target_modules) == ("single", 32, 32.0, ("all-linear",))
    assert le.gradient_checkpointing and (le.micro_batch_size, le.max_tokens_per_micro_batch) == (4, 16384)
    m = lora.model
    assert (m.engine, m.device, m.memory_share, m.name) == ("vllm", "cuda:1", 0.9, "Qwen2.5-7B-Instruct")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["learner.backend=deepspeed"], "learner.backend must be"),
        (["learner.world_size=2"], "needs learner.backend 'ray'"),
        (["learner.backend=openrlhf", "learner.world_size=2"], "needs learner.backend 'ray'"),
        (["learner.backend=ray", "learner.world_size=0"], "world_size must be >= 1"),
        (["learner.backend=openrlhf", "learner.zero_stage=4"], "zero_stage"),
        (["learner.backend=openrlhf", "learner.param_dtype=int8"], "param_dtype"),
        (["learner.param_dtype=bf16"], "single learner trains in the model's own dtype"),
        (["learner.backend=openrlhf", "learner.micro_batch_size=3"], r"multiple of learner.micro_batch_size"),
        (["learner.backend=ray", "learner.world_size=3", "learner.micro_batch_size=4"], r"= 12 for the ray learner"),
        (["learner.nodes=2"], "unknown field"),
    ],
)
def test_bad_learner_settings_fail_with_a_clear_error(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_args(argv)


def test_single_backend_accepts_any_batch_geometry():
    cfg, _ = parse_args(["learner.micro_batch_size=3"])  # accumulation handles a ragged last micro-batch
    assert cfg.learner.backend == "single" and cfg.run.batch_size == 16 and 16 % 3
