"""docs/tutorial_gpu.md: every bash block parses, and every ``agentenv train`` command resolves.

No GPU is needed: each training command runs with ``--print-config`` (the recipe read, the overrides
applied, the environment's arguments checked, nothing loaded) and the printed config is compared
with what the page says the command does.
"""

from __future__ import annotations

import shlex
import subprocess

import pytest
import yaml

from agentenv.trainer import recipe
from tests.docs.blocks import code_blocks

PAGE = "tutorial_gpu.md"


def bash_blocks() -> list[str]:
    return [b.code for b in code_blocks(PAGE) if b.lang == "bash"]


def train_commands() -> list[list[str]]:
    """The arguments after ``agentenv train`` of each training command (``VAR=value`` prefixes dropped)."""
    out = []
    for code in bash_blocks():
        for line in code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and "=" in words[0] and not words[0].startswith("-"):
                words = words[1:]
            if words[:2] == ["agentenv", "train"]:
                out.append([w for w in words[2:] if w != "--print-config"])
    return out


def test_every_bash_block_parses():
    blocks = bash_blocks()
    assert len(blocks) == 7
    for code in blocks:
        done = subprocess.run(["bash", "-n", "-c", code], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{code}\n{done.stderr}"


# What the page says each training command does, in page order.
EXPECTED = [
    {("model", "engine"): "vllm", ("model", "device"): "cuda", ("learner", "backend"): "openrlhf",
     ("learner", "param_dtype"): "bf16", ("model", "name"): "/models/Qwen2.5-1.5B-Instruct"},
    {("learner", "backend"): "ray", ("learner", "world_size"): 4, ("optim", "lr"): 1e-6,
     ("run", "batch_size"): 128, ("objective", "delta"): 0.001, ("model", "engine"): "vllm"},
    {("learner", "backend"): "single", ("learner", "lora_rank"): 32, ("optim", "lr"): 1e-5,
     ("model", "engine"): "vllm", ("model", "device"): "cuda:1", ("model", "name"): "/models/Qwen2.5-7B-Instruct"},
    {("learner", "backend"): "ray", ("learner", "world_size"): 16, ("run", "run_dir"): "/shared/runs/qwen7b"},
    {("learner", "backend"): "ray", ("model", "name"): "/models/Qwen2.5-7B-Instruct"},
]


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_each_training_command_resolves_to_what_the_page_says(index, capsys):
    commands = train_commands()
    assert len(commands) == len(EXPECTED)
    assert recipe.main([*commands[index], "--print-config"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    for (section, field), value in EXPECTED[index].items():
        assert cfg[section][field] == value, (commands[index], section, field)
