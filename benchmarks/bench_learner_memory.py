"""Peak memory of one learner step against rows, micro-batch tokens and sequence length.

Each measurement runs in its own process: a random-weight model of the named shape (float32, CPU),
one warm-up update (AdamW's state is created), glibc's free heap returned, then the peak resident set
is reset (``/proc/self/clear_refs``) and one more update runs. Reported: ``step MB``, the peak
resident memory of that update above the memory held before it (weights, gradients' home, AdamW
state), so the model's own size cancels out; and the largest tensor of vocabulary width that
autograd kept for the backward pass (``vocab saved MB``: 0 when the logits are recomputed per chunk).

Settings:

* ``one_pass``: the learner before token budgets and chunking: ``micro_batch_size`` 16 rows per pass
  (each padded to the longest), the shared prefix served inside the pass, logits of every policy
  token kept for the backward pass (the chunked path switched off);
* ``budget``: micro-batches of at most ``max_tokens_per_micro_batch`` tokens (rows sorted by length),
  the prefix run once per step, log-probabilities in chunks of ``logprob_chunk_tokens`` (1024 for
  ``rows`` and ``budget``, 512 for ``long``).

Tables:

* ``rows``: B recipe-shaped rows (a 250-token shared system prompt, then 30 prompt, 90 policy,
  30 observation and 60 policy tokens, lengths varied by up to 25%), SmolLM2-shaped model cut to 4
  layers (V = 49152): ``one_pass`` grows with B up to 16 rows; ``budget`` (1024 tokens) stays flat.
* ``budget``: B = 16 of those rows at budgets 512, 1024 and 2048 tokens: linear in the micro-batch's tokens.
* ``long``: two rows of T tokens (all but 16 of them policy tokens), each in its own pass (a budget
  below either row), on a Qwen2.5-7B-shaped model
  (V = 152064, head size 128, MLP 5.29 x width) cut to width
  ``h`` and ``n`` layers. The per-token bytes of a layer and of the rest, fitted over two depths and
  two widths between T = 1024 and 2048 (both two chunks or more: from the second chunk on, autograd
  holds one head-sized gradient temporary, ``V x h``, while it adds a chunk's into the head's), extrapolate
  the step at the full shape (width 3584, 28 layers) and T = 16384.

Usage (about 15 minutes on 2 busy CPU cores, under 3 GB; ``rows`` or ``long`` runs one part)::

    .venv/bin/python benchmarks/bench_learner_memory.py [rows] [long]
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

QWEN7B = {"vocab": 152064, "hidden": 3584, "layers": 28, "heads": 28, "kv_heads": 4, "mlp": 18944}


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _model(shape: dict):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["mlp"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], max_position_embeddings=32768, tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(cfg).float()


def _rows(spec: dict, seed: int):
    from agentenv.trajectory import Trajectory

    rng = random.Random(seed)
    system = [rng.randrange(1000, 40000) for _ in range(spec.get("prefix", 0))]
    out = []
    for i in range(spec["rows"]):
        draw = lambda n: [rng.randrange(1000, 40000) for _ in range(n)]  # noqa: E731
        vary = lambda n: max(1, round(n * rng.uniform(0.75, 1.25)))  # noqa: E731
        t = Trajectory(id=f"r{i}", start_version=0)
        if spec.get("long"):
            t.append_environment_tokens(draw(16))
            t.append_policy_tokens(draw(spec["long"] - 16), [-1.0] * (spec["long"] - 16), 0, 0)
        else:
            t.append_environment_tokens(system + draw(30))
            for turn, n in enumerate((vary(90), vary(30), vary(60))):
                if turn == 1:
                    t.append_environment_tokens(draw(n))
                else:
                    t.append_policy_tokens(draw(n), [-1.0] * n, turn // 2, 0)
        t.completion_version = 0
        t.reward = float(i % 2)
        out.append(t)
    return out


def run_one(spec: dict) -> dict:
    """One measurement (see the module docstring); ``spec`` names the shape, rows and setting."""
    import torch

    from agentenv.malloc import release_free_heap, return_freed_memory_to_os
    from agentenv.trainer.learners import forward as forward_module
    from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
    from agentenv.trainer.learners.single import Learner

    return_freed_memory_to_os(256 << 10, 1)  # freed blocks leave at once: resident memory tracks live tensors
    torch.set_num_threads(2)
    model = _model(spec["shape"])
    if spec["setting"] == "one_pass":
        forward_module.split_head = lambda model: None  # the model's own forward: logits kept for backward
        execution = LearnerConfig(micro_batch_size=spec["micro_batch_size"])
    else:
        execution = LearnerConfig(micro_batch_size=1024, max_tokens_per_micro_batch=spec["budget"],
                                  logprob_chunk_tokens=spec["chunk"])
    learner = Learner(model, OptimConfig(lr=1e-6), objective=ObjectiveConfig(delta=10.0), execution=execution)
    learner.update(_rows(spec, 1))  # AdamW's state
    rows = _rows(spec, 2)
    vocab = spec["shape"]["vocab"]
    largest = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dim() >= 2 and t.shape[-1] == vocab and t.data_ptr() != model.lm_head.weight.data_ptr():
            largest[0] = max(largest[0], t.numel() * t.element_size())
        return t

    release_free_heap()
    base = _rss("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set, to the current one
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        learner.update(rows)
    return {**spec, "seconds": time.perf_counter() - t0, "step_mb": (_rss("VmHWM") - base) / 1e6,
            "base_mb": base / 1e6, "vocab_saved_mb": largest[0] / 1e6}


def _measure(spec: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True,
                          check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cut(hidden: int, layers: int) -> dict:
    """The Qwen2.5-7B shape at width ``hidden`` (head size 128, one key/value head) and ``layers`` layers."""
    return {"vocab": QWEN7B["vocab"], "hidden": hidden, "layers": layers, "heads": hidden // 128, "kv_heads": 1,
            "mlp": round(hidden * QWEN7B["mlp"] / QWEN7B["hidden"])}


def rows_table() -> None:
    """The ``rows`` and ``budget`` tables."""
    smol4 = {"vocab": 49152, "hidden": 576, "layers": 4, "heads": 9, "kv_heads": 3, "mlp": 1536}
    print("rows: B recipe-shaped rows (~460 tokens, 250 shared), SmolLM2 shape cut to 4 layers")
    print(f"{'setting':<10} {'B':>4} {'budget':>7} {'step MB':>9} {'vocab saved MB':>15} {'s':>6}")
    table = [{"setting": "one_pass", "rows": b, "budget": 0} for b in (4, 8, 16)]
    table += [{"setting": "budget", "rows": b, "budget": 1024} for b in (4, 16, 32)]
    table += [{"setting": "budget", "rows": 16, "budget": t} for t in (512, 2048)]
    for spec in table:
        r = _measure({**spec, "shape": smol4, "prefix": 250, "chunk": 1024, "micro_batch_size": 16})
        print(f"{r['setting']:<10} {r['rows']:>4} {r['budget'] or '-':>7} {r['step_mb']:>9.0f} "
              f"{r['vocab_saved_mb']:>15.0f} {r['seconds']:>6.1f}", flush=True)


def long_table() -> None:
    """The ``long`` table and the extrapolation to Qwen2.5-7B at 16k tokens."""
    print("long: two rows of T tokens, each in its own pass, Qwen2.5-7B shape (V 152064) cut to width h, n layers")
    print(f"{'setting':<10} {'h':>5} {'n':>3} {'T':>6} {'step MB':>9} {'vocab saved MB':>15} {'s':>6}")
    fit: dict[tuple[int, int], float] = {}
    runs = [("one_pass", 256, 1, t) for t in (512, 1024)]
    runs += [("budget", h, n, t) for h in (256, 512) for n in (1, 2) for t in (1024, 2048)]
    runs += [("budget", 256, 1, 4096)]
    for setting, h, n, t in runs:
        # two rows (one rewarded: a batch of one has advantage 0), each in its own pass: the budget of
        # 1 token is below every row, which then runs alone
        r = _measure({"setting": setting, "rows": 2, "long": t, "budget": 1, "shape": _cut(h, n), "chunk": 512,
                      "micro_batch_size": 1})
        print(f"{setting:<10} {h:>5} {n:>3} {t:>6} {r['step_mb']:>9.0f} {r['vocab_saved_mb']:>15.0f} "
              f"{r['seconds']:>6.1f}", flush=True)
        if setting == "budget" and t in (1024, 2048):
            fit[(h, n, t)] = r["step_mb"]
    # bytes per token: of one layer (depth slope) and of everything else, each linear in the width
    per_token = {key: (fit[(*key, 2048)] - fit[(*key, 1024)]) / 1024 for key in {(h, n) for h, n, _ in fit}}
    layer = {h: per_token[(h, 2)] - per_token[(h, 1)] for h in (256, 512)}
    rest = {h: per_token[(h, 1)] - layer[h] for h in (256, 512)}
    lin = lambda f, w: f[256] + (f[512] - f[256]) * (w - 256) / 256  # noqa: E731
    full_per_token = QWEN7B["layers"] * lin(layer, QWEN7B["hidden"]) + lin(rest, QWEN7B["hidden"])
    intercept = fit[(256, 1, 1024)] - 1024 * per_token[(256, 1)]
    print(f"\nper token: {1e6 * layer[256]:.0f} / {1e6 * layer[512]:.0f} B a layer at width 256 / 512, "
          f"{1e6 * rest[256]:.0f} / {1e6 * rest[512]:.0f} B the rest")
    chunk_mb = 512 * QWEN7B["vocab"] * 4 / 1e6
    head_grad_gb = QWEN7B["vocab"] * QWEN7B["hidden"] * 4 / 1e9
    print(f"extrapolated to width 3584, 28 layers, T = 16384, float32: {16384 * full_per_token / 1e3:.1f} GB that "
          f"grow with the tokens, plus a fixed part ({intercept:.0f} MB at width 256: a 512-token chunk's logits, "
          f"softmax and gradient, {chunk_mb:.0f} MB each, and a V x h head-gradient temporary, "
          f"{head_grad_gb:.2f} GB at width 3584); the T x V float32 logits alone: "
          f"{16384 * QWEN7B['vocab'] * 4 / 1e9:.1f} GB")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(run_one(json.loads(sys.argv[2]))))
        return
    tables = sys.argv[1:] or ["rows", "long"]
    if "rows" in tables:
        rows_table()
    if "long" in tables:
        long_table()


if __name__ == "__main__":
    main()
