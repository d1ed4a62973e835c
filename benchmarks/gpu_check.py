"""One prepared GPU check (H200, bf16, offline): FlashREINFORCE update cost vs a plain NLL step, the
objective's own overhead, decode throughput of the transformers engine, and (if DeepSpeed and OpenRLHF
are installed) one update through the OpenRLHF/DeepSpeed backend's GPU path.

Runs on a randomly initialised Qwen2.5-1.5B-shaped model whose config is written out below (no
weights, no hub, no vLLM). Baselines are measured in the same run:

* ``nll_fwd_bwd``: forward + backward of the mean token NLL on the same B x L tokens (plain SFT step);
* ``fr_fwd_bwd``: forward + FlashREINFORCE objective + backward on the same tokens (no optimizer);
* ``fr_update``: ``Learner.update`` end to end (batching, gate, objective, backward, clip, AdamW);
* ``score``: ``Learner.score`` (the no-grad pass PACE's drift and the gate use);
* ``objective_only``: ``flash_reinforce_loss`` forward + backward on precomputed (B, t) log-probs;
* ``decode``: ``TransformersEngine`` tokens/s at batch 1/8/32 (skipped if the module is missing);
* ``deepspeed_update``: ``OpenRLHFLearner.update`` (ZeRO-2, bf16, torch AdamW) on 1 GPU (skipped
  if deepspeed/openrlhf are missing).

Times are medians over ``--repeats`` after one warm-up, in ms; memory is the peak allocated GiB
during the step. Prints a compact table; writes JSON to ``$OUT/gpu_check.json`` when ``$OUT`` is set
(or to ``--json``). ``--tiny`` runs a small config on the CPU in seconds (used to check the script).

Usage: ``python benchmarks/gpu_check.py`` (H200, < 4 min) or ``python benchmarks/gpu_check.py --tiny``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def bootstrap_agentenv() -> str:
    """Import agentenv installed, or else straight from this checkout without its package deps.

    The GPU machine may have only torch and transformers (no gymnasium, no ``pip install -e .``).
    The modules used here (trainer objectives, batching, learner, the transformers engine) need only
    torch, so a bare ``agentenv`` package whose path covers ``agentenv/`` and the repository root
    (``agentenv.trainer`` -> ``trainer/``, as pyproject's package-dir maps it) is enough.
    """
    try:
        import agentenv.trainer.learners.single  # noqa: F401

        return "installed"
    except ImportError:
        pass
    import types

    for name in [m for m in sys.modules if m == "agentenv" or m.startswith("agentenv.")]:
        del sys.modules[name]
    pkg = types.ModuleType("agentenv")
    pkg.__path__ = [str(REPO / "agentenv"), str(REPO)]
    sys.modules["agentenv"] = pkg
    return "from checkout (bare package)"


QWEN25_15B = dict(  # Qwen2.5-1.5B(-Instruct) config.json, written out by hand
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_dropout=0.0,
)
TINY = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_dropout=0.0,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="small config on the CPU (checks the script)")
    p.add_argument("--rows", type=int, default=None, help="B rows (default 8; tiny 2)")
    p.add_argument("--seq", type=int, default=None, help="tokens per row (default 1024; tiny 64)")
    p.add_argument("--micro", type=int, default=None, help="micro-batch rows (default: all rows)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--decode-tokens", type=int, default=None, help="new tokens per request (default 64; tiny 8)"
    )
    p.add_argument("--decode-batches", default=None, help="comma list (default 1,8,32; tiny 1,2,4)")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--skip-deepspeed", action="store_true")
    p.add_argument("--json", default=None, help="also write the JSON here")
    return p.parse_args()


class Clock:
    """Wall time with CUDA synchronisation, and peak memory per measured call."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def measure(self, fn, repeats: int) -> dict:
        fn()  # warm-up
        self.sync()
        times, peaks = [], []
        for _ in range(repeats):
            if self.cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3)
            peaks.append(torch.cuda.max_memory_allocated() / 2**30 if self.cuda else float("nan"))
        return {"ms": statistics.median(times), "ms_all": times, "peak_gib": max(peaks)}


def build_model(cfg: dict, device: torch.device, dtype: torch.dtype):
    import transformers

    config = transformers.Qwen2Config(**cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM(config)
    return model.to(dtype)


def make_trajectories(rows: int, seq: int, vocab: int, prompt: int, seed: int = 0):
    """Rows of ``seq`` tokens: a prompt, then alternating policy and observation chunks."""
    from agentenv.trajectory import Trajectory

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(rows):
        tr = Trajectory(id=f"row{i}")
        tr.append_environment_tokens(torch.randint(1, vocab, (prompt,), generator=g).tolist())
        tr.prompt_length = prompt
        k = 0
        while len(tr.token_ids) < seq:
            n = min(seq - len(tr.token_ids), 96)
            ids = torch.randint(1, vocab, (n,), generator=g).tolist()
            if k % 2 == 0:
                tr.append_policy_tokens(ids, [-2.0] * n, 0, 0)
            else:
                tr.append_environment_tokens(ids[: max(1, n // 3)])
            k += 1
        tr.reward = float(i % 2)
        out.append(tr)
    return out


def on_policy(trajs, scores):
    from agentenv.trajectory import Trajectory

    out = []
    for tr, s in zip(trajs, scores, strict=True):
        d = tr.to_dict()
        pos = [j for j, m in enumerate(d["loss_mask"]) if m]
        blp = list(d["behaviour_logprobs"])
        for j, v in zip(pos, s.tolist(), strict=True):
            blp[j] = min(float(v), 0.0)
        d["behaviour_logprobs"] = blp
        out.append(Trajectory.from_dict(d))
    return out


def bench_learner(args, model, device, clock, results) -> None:
    from agentenv.trainer.advantages import batch_mean_advantages
    from agentenv.trainer.batching import build_batch, split_micro_batches
    from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
    from agentenv.trainer.learners.forward import token_logprobs
    from agentenv.trainer.learners.single import Learner
    from agentenv.trainer.objectives import flash_reinforce_loss

    vocab = model.config.vocab_size
    trajs = make_trajectories(args.rows, args.seq, vocab, prompt=max(8, args.seq // 8))
    learner = Learner(model, OptimConfig(lr=1e-6), objective=ObjectiveConfig(delta=1e-3),
                      execution=LearnerConfig(micro_batch_size=args.micro))
    results["score"] = clock.measure(lambda: learner.score(trajs), args.repeats)
    trajs = on_policy(trajs, learner.score(trajs))  # rho = 1, D = 0: every row admitted
    batch = build_batch(trajs)
    from dataclasses import replace

    batch = replace(batch, advantages=batch_mean_advantages(batch.rewards))
    results["tokens"] = {
        "rows": batch.num_rows,
        "seq_tokens": int(batch.attention_mask.sum()),
        "policy_tokens": int(batch.lengths.sum()),
    }

    def nll_step():
        model.zero_grad(set_to_none=True)
        for mb in split_micro_batches(batch, args.micro):
            mb = mb.to(device)
            lp, _ = token_logprobs(model, mb)
            loss = -(lp[mb.loss_mask].sum() / batch.global_tokens)
            loss.backward()

    def fr_step():
        model.zero_grad(set_to_none=True)
        for mb in split_micro_batches(batch, args.micro):
            mb = mb.to(device)
            lp, _ = token_logprobs(model, mb)
            out = flash_reinforce_loss(
                lp,
                mb.behaviour_logprobs,
                mb.loss_mask,
                mb.advantages,
                mb.lengths,
                batch.global_batch_size,
                delta=learner.objective.delta,
            )
            out.loss.backward()

    results["nll_fwd_bwd"] = clock.measure(nll_step, args.repeats)
    results["fr_fwd_bwd"] = clock.measure(fr_step, args.repeats)
    model.zero_grad(set_to_none=True)
    stats = []
    results["fr_update"] = clock.measure(lambda: stats.append(learner.update(trajs)), args.repeats)
    results["fr_update"]["stepped"] = all(s.stepped for s in stats)
    results["fr_update"]["admitted_fraction"] = stats[-1].objective.admitted_fraction

    # objective alone on precomputed log-probs (leaf tensor): its forward + backward
    b = batch.to(device)
    with torch.no_grad():
        lp0 = (
            torch.cat(
                [token_logprobs(model, mb.to(device))[0] for mb in split_micro_batches(batch, args.micro)]
            )
            if args.micro >= batch.num_rows
            else None
        )
    if lp0 is None:  # micro-batches have different padded widths: score each, pad to the batch width
        lp0 = torch.zeros(b.loss_mask.shape, device=device)
        r = 0
        for mb in split_micro_batches(batch, args.micro):
            with torch.no_grad():
                x = token_logprobs(model, mb.to(device))[0]
            lp0[r : r + mb.num_rows, : x.shape[1]] = x
            r += mb.num_rows
    lp0 = lp0.detach().float()

    def objective_only():
        x = lp0.clone().requires_grad_(True)
        out = flash_reinforce_loss(
            x,
            b.behaviour_logprobs,
            b.loss_mask,
            b.advantages,
            b.lengths,
            batch.global_batch_size,
            delta=learner.objective.delta,
        )
        out.loss.backward()

    results["objective_only"] = clock.measure(objective_only, max(args.repeats, 5))
    learner = None  # free the optimizer state before the next section
    model.zero_grad(set_to_none=True)


def bench_decode(args, model, device, clock, results) -> None:
    try:
        from agentenv.engines.base import SamplingParams
        from agentenv.engines.transformers_engine import TransformersEngine
    except Exception as e:  # noqa: BLE001
        results["decode"] = {"skipped": f"transformers engine not importable: {e}"}
        return
    vocab = model.config.vocab_size
    out = {}
    for bs in args.decode_batches:
        engine = TransformersEngine(model, max_batch_size=bs, seed=0)
        g = torch.Generator().manual_seed(bs)
        prompts = [torch.randint(1, vocab, (64,), generator=g).tolist() for _ in range(bs)]
        params = SamplingParams(max_new_tokens=args.decode_tokens, temperature=1.0, top_p=1.0, seed=1)

        async def run(prompts=prompts, params=params, engine=engine):
            res = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
            return sum(len(r.token_ids) for r in res)

        async def main(engine=engine, run=run):
            await run()  # warm-up (prefill paths, allocator)
            clock.sync()
            t0 = time.perf_counter()
            n = await run()
            clock.sync()
            dt = time.perf_counter() - t0
            await engine.close()
            return n, dt

        n, dt = asyncio.run(main())
        out[str(bs)] = {"tokens": n, "seconds": dt, "tokens_per_s": n / dt}
    results["decode"] = out


def bench_deepspeed(args, cfg: dict, device: torch.device, dtype: torch.dtype, clock, results) -> None:
    try:
        import deepspeed  # noqa: F401

        from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
        from agentenv.trainer.learners.deepspeed_strategy import OpenRLHFBackendConfig
        from agentenv.trainer.learners.openrlhf import OpenRLHFLearner
    except Exception as e:  # noqa: BLE001
        results["deepspeed_update"] = {"skipped": f"deepspeed/openrlhf not importable: {e}"}
        return
    try:
        model = build_model(cfg, device, torch.float32 if dtype == torch.float32 else torch.float32)
        backend = OpenRLHFBackendConfig(
            rows_per_update=args.rows,
            zero_stage=2,
            param_dtype="fp32" if device.type == "cpu" else "bf16",
            torch_adam=True,
        )
        learner = OpenRLHFLearner(model, OptimConfig(lr=1e-6), backend, objective=ObjectiveConfig(delta=1e-3),
                                  execution=LearnerConfig(micro_batch_size=args.micro))
        trajs = make_trajectories(
            args.rows, args.seq, cfg["vocab_size"], prompt=max(8, args.seq // 8), seed=1
        )
        trajs = on_policy(trajs, learner.score(trajs))
        stats = []
        r = clock.measure(lambda: stats.append(learner.update(trajs)), args.repeats)
        r.update(
            stepped=all(s.stepped for s in stats),
            grad_norm=stats[-1].grad_norm,
            engine=type(learner.engine).__name__,
            optimizer=type(learner.engine.optimizer).__name__,
        )
        results["deepspeed_update"] = r
        learner = model = None
    except Exception as e:  # noqa: BLE001
        results["deepspeed_update"] = {
            "error": f"{type(e).__name__}: {e}",
            "trace": traceback.format_exc()[-2000:],
        }


def main() -> int:
    args = parse_args()
    tiny = args.tiny
    device = torch.device("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    args.rows = args.rows or (2 if tiny else 8)
    args.seq = args.seq or (64 if tiny else 1024)
    args.micro = args.micro or args.rows
    args.decode_tokens = args.decode_tokens or (8 if tiny else 64)
    args.decode_batches = [
        int(x) for x in (args.decode_batches or ("1,2,4" if tiny else "1,8,32")).split(",")
    ]
    cfg = TINY if tiny else QWEN25_15B
    agentenv_mode = bootstrap_agentenv()
    clock = Clock(device)
    t_start = time.perf_counter()
    import transformers

    results: dict = {
        "config": "tiny" if tiny else "qwen2.5-1.5b-shape (random init)",
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "rows": args.rows,
        "seq": args.seq,
        "micro": args.micro,
        "repeats": args.repeats,
        "agentenv": agentenv_mode,
    }
    t0 = time.perf_counter()
    model = build_model(cfg, device, dtype)
    clock.sync()
    results["model_build_s"] = time.perf_counter() - t0
    results["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    for name, fn in (
        ("learner", lambda: bench_learner(args, model, device, clock, results)),
        ("decode", None if args.skip_decode else lambda: bench_decode(args, model, device, clock, results)),
    ):
        if fn is None:
            results[name] = {"skipped": "--skip-decode"}
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            results[f"{name}_error"] = f"{type(e).__name__}: {e}"
            results[f"{name}_trace"] = traceback.format_exc()[-2000:]
    model = None  # noqa: F841 (frees GPU memory before the DeepSpeed section)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.skip_deepspeed:
        results["deepspeed_update"] = {"skipped": "--skip-deepspeed"}
    else:
        bench_deepspeed(args, cfg, device, dtype, clock, results)
    results["total_s"] = time.perf_counter() - t_start
    report(results)
    out_dir = os.environ.get("OUT")
    paths = [Path(out_dir) / "gpu_check.json"] if out_dir else []
    if args.json:
        paths.append(Path(args.json))
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {p}")
    return 0


def report(r: dict) -> None:
    print(
        f"\n{r['config']} | {r['device']} | {r['dtype']} | {r.get('params_m', 0):.1f}M params | "
        f"B={r['rows']} x {r['seq']} tok, micro {r['micro']} | torch {r['torch']} | "
        f"build {r['model_build_s']:.1f}s"
    )
    print(f"{'measure':<22}{'median ms':>12}{'peak GiB':>10}{'vs NLL':>9}")
    nll = r.get("nll_fwd_bwd", {}).get("ms")
    for k in ("nll_fwd_bwd", "fr_fwd_bwd", "fr_update", "score", "objective_only", "deepspeed_update"):
        v = r.get(k)
        if not isinstance(v, dict) or "ms" not in v:
            if v is not None:
                print(f"{k:<22}{'-':>12}   {v.get('skipped') or v.get('error')}")
            continue
        ratio = f"{v['ms'] / nll:.3f}" if nll else "-"
        print(f"{k:<22}{v['ms']:>12.2f}{v['peak_gib']:>10.2f}{ratio:>9}")
    if nll and "fr_fwd_bwd" in r:
        print(
            f"objective overhead: {r['fr_fwd_bwd']['ms'] - nll:+.2f} ms per fwd+bwd "
            f"(objective alone {r['objective_only']['ms']:.2f} ms)"
        )
    dec = r.get("decode", {})
    if "skipped" in dec:
        print(f"decode: skipped ({dec['skipped']})")
    else:
        print("decode tokens/s: " + ", ".join(f"batch {k}: {v['tokens_per_s']:.1f}" for k, v in dec.items()))
    for k in ("learner_error", "decode_error"):
        if k in r:
            print(f"{k}: {r[k]}")
    print(f"total {r['total_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
