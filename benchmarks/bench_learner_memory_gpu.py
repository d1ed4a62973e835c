"""Peak GPU memory of one learner step on a Qwen2.5-7B-shaped model and 16k-token rows (one CUDA device).

A randomly initialised Qwen2.5-7B (28 layers, width 3584, 28 query and 4 key/value heads, MLP 18944,
V = 152064, untied head; 7.6 B parameters), bfloat16, activation checkpointing on, ``torch.optim.AdamW``,
trained by :class:`agentenv.trainer.learners.single.Learner` on two rows of T tokens (all but 16 of them
policy tokens; one rewarded, so the batch carries gradient), each in its own micro-batch. One update
creates AdamW's state; the next is measured: ``step GB`` is the peak of ``torch.cuda.max_memory_allocated``
during it above what was allocated before it (weights, gradients, AdamW state); ``vocab saved GB`` the
largest tensor of vocabulary width that autograd kept for the backward pass (0 when the logits are
recomputed chunk by chunk).

Settings, each in its own process:

* ``chunked``: the learner as it runs: log-probabilities ``learner.logprob_chunk_tokens`` (1024) tokens at a
  time, logits recomputed in the backward pass (:mod:`agentenv.trainer.learners.logprob_chunks`);
* ``full``: the model's own forward (the chunked path switched off): a T x V logits tensor and its
  float32 log-softmax live through the backward pass.

Usage (on one GPU, about 3 minutes for both settings; ``--tiny`` checks the script on a CPU)::

    python benchmarks/bench_learner_memory_gpu.py [--layers 28] [--tokens 16384] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

QWEN7B = {"vocab": 152064, "hidden": 3584, "layers": 28, "heads": 28, "kv_heads": 4, "mlp": 18944}
TINY = {"vocab": 1024, "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 128}


def _rows(tokens: int, vocab: int, seed: int) -> list:
    from agentenv.trajectory import Trajectory

    rng = random.Random(seed)
    out = []
    for i in range(2):
        t = Trajectory(id=f"r{i}", start_version=0)
        t.append_environment_tokens([rng.randrange(vocab) for _ in range(16)])
        t.append_policy_tokens([rng.randrange(vocab) for _ in range(tokens - 16)], [-1.0] * (tokens - 16), 0, 0)
        t.completion_version = 0
        t.reward = float(i)
        out.append(t)
    return out


def run_one(setting: str, shape: dict, tokens: int, device: str) -> dict:
    """One setting in this process; returns its figures (see the module docstring)."""
    import torch
    import transformers

    from agentenv.trainer.learners import forward as forward_module
    from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
    from agentenv.trainer.learners.single import Learner

    cuda = device == "cuda"
    cfg = transformers.Qwen2Config(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["mlp"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], max_position_embeddings=32768, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    t0 = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16 if cuda else torch.float32)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    init_s = time.perf_counter() - t0
    if setting == "full":
        forward_module.split_head = lambda model: None  # the model's own forward: logits kept for backward
    learner = Learner(model, OptimConfig(lr=1e-6, weight_decay=0.0), objective=ObjectiveConfig(delta=10.0),
                      execution=LearnerConfig(micro_batch_size=1, gradient_checkpointing=True))
    learner.update(_rows(tokens, shape["vocab"], 1))  # AdamW's state
    rows = _rows(tokens, shape["vocab"], 2)
    largest = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dim() >= 2 and t.shape[-1] == shape["vocab"] and t.data_ptr() != model.lm_head.weight.data_ptr():
            largest[0] = max(largest[0], t.numel() * t.element_size())
        return t

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stats = learner.update(rows)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return {"setting": setting, "layers": shape["layers"], "tokens": tokens, "params_b": model.num_parameters() / 1e9,
            "base_gb": base / 1e9, "step_gb": (peak - base) / 1e9, "vocab_saved_gb": largest[0] / 1e9,
            "update_s": seconds, "init_s": init_s, "stepped": stats.stepped,
            "device": torch.cuda.get_device_name() if cuda else "cpu"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=QWEN7B["layers"])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--tiny", action="store_true", help="a small model on the CPU: checks the script only")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    shape = {**(TINY if args.tiny else QWEN7B), "layers": args.layers if not args.tiny else TINY["layers"]}
    tokens = 64 if args.tiny else args.tokens
    device = "cpu" if args.tiny else "cuda"
    if args.one:
        print(json.dumps(run_one(args.one, shape, tokens, device)))
        return
    print(f"{'setting':<8} {'layers':>6} {'T':>6} {'params B':>9} {'held GB':>8} {'step GB':>8} "
          f"{'vocab saved GB':>15} {'update s':>9}")
    for setting in ("chunked", "full"):
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", setting], capture_output=True,
                              text=True, timeout=900)
        if done.returncode:
            print(f"{setting:<8} failed:\n{done.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{r['setting']:<8} {r['layers']:>6} {r['tokens']:>6} {r['params_b']:>9.2f} {r['base_gb']:>8.1f} "
              f"{r['step_gb']:>8.1f} {r['vocab_saved_gb']:>15.2f} {r['update_s']:>9.2f}  {json.dumps(r)}", flush=True)


if __name__ == "__main__":
    main()
