"""Transformers engine throughput against plain ``model.generate``, and the cost of one interruption.

CPU (the real default model):
    .venv/bin/python benchmarks/bench_engines.py --batch-sizes 1 8 32 --new-tokens 64
GPU (no weights travel: random init with the real architecture, bf16):
    python benchmarks/bench_engines.py --device cuda --config qwen2.5-1.5b --new-tokens 256

For each batch size B: B concurrent ``engine.generate`` requests (prompt 32 tokens, exactly N new
tokens, temperature 1) against one ``model.generate(do_sample=True, min_new_tokens=N)`` call on the
same B prompts; output tokens per second and the ratio engine / generate. Then the cost of one weight
update landing mid-generation (B=8): the latency of ``update_weights`` (ms, from the call to the
first token under the new version being possible) and the extra wall time of the whole batch
against an uninterrupted run, for KEEP and RECOMPUTE. Each figure is the best of ``--repeats`` runs
(engine and baseline alternate), so warm-up effects do not favour either side.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from agentenv.engines.base import ContinuationMode, SamplingParams
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.models import load_model_and_tokenizer, random_model_from_config


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, min(vocab, 30000), (batch, length), generator=g).tolist()


async def engine_run(engine, batch_prompts, new_tokens, update=None) -> tuple[float, float | None]:
    params = [
        SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i) for i in range(len(batch_prompts))
    ]
    start = time.perf_counter()
    tasks = [asyncio.create_task(engine.generate(p, s)) for p, s in zip(batch_prompts, params, strict=True)]
    update_ms = None
    if update is not None:
        steps0 = engine.num_steps
        while engine.num_steps < steps0 + new_tokens // 2:
            await asyncio.sleep(0.001)
        t0 = time.perf_counter()
        await engine.update_weights(update, engine.version + 1)
        update_ms = (time.perf_counter() - t0) * 1e3
    outs = await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    assert all(len(o.token_ids) == new_tokens for o in outs)
    return wall, update_ms


def generate_run(model, batch_prompts, new_tokens, device) -> float:
    ids = torch.tensor(batch_prompts, device=device)
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )
    sync(device)
    assert out.shape[1] == ids.shape[1] + new_tokens
    return time.perf_counter() - start


async def main(args: argparse.Namespace) -> None:
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if args.config:
        model = random_model_from_config(args.config, dtype=dtype, device=args.device)
        name = f"{args.config} (random init)"
    else:
        model, _ = load_model_and_tokenizer(args.model, dtype=dtype, device=args.device)
        name = args.model
    vocab = model.config.vocab_size
    torch.set_grad_enabled(False)
    print(
        f"model={name} device={args.device} dtype={args.dtype} "
        f"prompt={args.prompt_tokens} new={args.new_tokens}"
    )
    print(f"torch threads={torch.get_num_threads()}")
    # warm-up (allocator, kernels)
    warm = TransformersEngine(model)
    await engine_run(warm, prompts(2, args.prompt_tokens, vocab), 4)
    # sanity: the engine's behaviour log-probs equal a full forward pass of the same weights
    check = prompts(4, args.prompt_tokens, vocab, seed=7)
    outs = await asyncio.gather(
        *[warm.generate(p, SamplingParams(max_new_tokens=16, seed=i)) for i, p in enumerate(check)]
    )
    worst = 0.0
    for p, o in zip(check, outs, strict=True):
        with torch.inference_mode():
            logits = (
                model(torch.tensor([p + o.token_ids], device=args.device)).logits[0, len(p) - 1 : -1].float()
            )
        ref = logits.log_softmax(-1).gather(1, torch.tensor(o.token_ids, device=args.device)[:, None])[:, 0]
        worst = max(worst, (ref.cpu() - torch.tensor(o.logprobs)).abs().max().item())
    print(f"logprob check: max |engine - full forward| = {worst:.2e} nats ({args.dtype})")
    await warm.close()
    generate_run(model, prompts(2, args.prompt_tokens, vocab), 4, args.device)

    print("\n| batch | engine tok/s | generate tok/s | engine / generate |")
    print("|---:|---:|---:|---:|")
    for b in args.batch_sizes:
        ps = prompts(b, args.prompt_tokens, vocab, seed=b)
        wall_e = wall_g = float("inf")
        engine = TransformersEngine(model, max_batch_size=max(b, 1))  # long-lived, like a real server
        await engine_run(engine, ps, 8)  # warm the decode thread (its first run is slow on CUDA)
        for _ in range(args.repeats):  # alternate the two, keep each one's best
            wall_e = min(wall_e, (await engine_run(engine, ps, args.new_tokens))[0])
            wall_g = min(wall_g, generate_run(model, ps, args.new_tokens, args.device))
        await engine.close()
        tok = b * args.new_tokens
        print(f"| {b} | {tok / wall_e:.1f} | {tok / wall_g:.1f} | {wall_g / wall_e:.2f} |", flush=True)

    b = args.interrupt_batch
    ps = prompts(b, args.prompt_tokens, vocab, seed=99)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    print(f"\ninterruption at mid-generation, batch {b}, {args.new_tokens} new tokens")
    print(
        "| mode | update_weights latency ms | batch wall s (uninterrupted) "
        "| batch wall s (interrupted) | extra ms |"
    )
    print("|---|---:|---:|---:|---:|")
    for mode in (ContinuationMode.KEEP, ContinuationMode.RECOMPUTE):
        engine = TransformersEngine(model, max_batch_size=b, continuation=mode)
        await engine_run(engine, ps, 8)
        base = wall = update_ms = float("inf")
        for _ in range(args.repeats):
            base = min(base, (await engine_run(engine, ps, args.new_tokens))[0])
            w, ms = await engine_run(engine, ps, args.new_tokens, update=state)
            wall, update_ms = min(wall, w), min(update_ms, ms)
        await engine.close()
        print(
            f"| {mode.value} | {update_ms:.1f} | {base:.2f} | {wall:.2f} | {(wall - base) * 1e3:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="model name or folder (ignored with --config)")
    ap.add_argument("--config", default=None, help="random init from a known config, e.g. qwen2.5-1.5b")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: bf16 on cuda")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--interrupt-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each measurement; the best is kept")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.dtype is None:
        a.dtype = "bfloat16" if a.device.startswith("cuda") else "float32"
    asyncio.run(main(a))
