"""Tiny seeded models and synthetic trajectories for the learner tests."""

from __future__ import annotations

import random

import torch

from agentenv.trajectory import Trajectory

VOCAB = 64


def tiny_model(seed: int = 0, arch: str = "llama", dtype: torch.dtype = torch.float32):
    """A 2-layer random Llama or Qwen2 causal LM (about 40k parameters)."""
    import transformers

    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype)


def make_trajectories(n: int, seed: int = 0, *, rewards=None, turns: int = 2) -> list[Trajectory]:
    """Trajectories with a prompt, ``turns`` policy turns and observations between them, varied lengths."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tr = Trajectory(task_id=f"task{i}", id=f"traj{seed}-{i}")
        tr.append_environment_tokens([rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 6))])
        tr.prompt_length = len(tr.token_ids)
        for k in range(turns):
            m = rng.randint(1, 8)
            tr.append_policy_tokens(
                [rng.randrange(1, VOCAB) for _ in range(m)], [-rng.uniform(0.5, 6.0) for _ in range(m)], k, k
            )
            if k + 1 < turns:
                tr.append_environment_tokens([rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 4))])
        tr.reward = float(rewards[i]) if rewards is not None else float(rng.random() < 0.5)
        out.append(tr)
    return out


def on_policy(trajectories, scores, noise: float = 0.0, seed: int = 0):
    """Copies of ``trajectories`` whose behaviour log-probs equal the scores (plus optional noise)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for tr, s in zip(trajectories, scores, strict=True):
        d = tr.to_dict()
        blp = list(d["behaviour_logprobs"])
        vals = (s.double() + noise * torch.randn(s.shape, generator=g, dtype=torch.float64)).clamp_max(0.0)
        pos = [j for j, m in enumerate(d["loss_mask"]) if m]
        for j, v in zip(pos, vals.tolist(), strict=True):
            blp[j] = v
        d["behaviour_logprobs"] = blp
        out.append(Trajectory.from_dict(d))
    return out
