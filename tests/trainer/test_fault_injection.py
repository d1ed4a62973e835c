"""Fault injection on the real parts, mid-run: the run finishes its updates and every task is accounted for.

``trainer.train.train()`` runs for real (collector, pool, learner on a 1-layer random Llama, metrics, final
checkpoint). One fault each, injected while the run trains:

* engine: the real ``TransformersEngine`` (built by ``setup.build_engine``) on that Llama; its decode
  thread is killed by ``AGENTENV_FAULT=engine.decode:K``; ``SupervisedEngine`` rebuilds it from the
  learner's latest weights and the in-flight episodes are requeued.
* sandbox: the real ``process`` backend under ``PythonToolEnv``; every sandbox worker process alive
  after update 1 gets ``SIGKILL``.
* environment: the real ``PythonToolEnv`` raises at its 6th step (``AGENTENV_FAULT=python_tool.step:6``).
* grader: the real math-verify grading worker gets ``SIGSTOP`` after update 1 (it hangs); the grader
  kills it at its deadline.

For the three python_tool faults the policy is scripted (a tool call ``x = 6 * 7``, a tool call
``print(x)``, then ``\\boxed{42}``), so that the sandbox and the grader are really used and every episode
the parts did not break earns reward 1: a batch holding a reward 0 would be a fault scored as the
policy's. Accounting, from the run's own files: the seeds consumed (``staleness.jsonl``), pooled, in flight
and requeued at the final checkpoint, plus the dropped tasks counted, are the seeds handed out, once each.
About 10-25 s per test on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentenv.engines.base import GenerationOutput, SamplingParams, TokenSpan
from agentenv.envs.python_tool import PythonToolEnv
from agentenv.envs.python_tool.datasets import MathProblem
from agentenv.envs.python_tool.grading import _WORKER_COMMAND, Grader
from agentenv.faults import FAULTS, reset_fault_points
from agentenv.trainer import recipe
from agentenv.trainer import train as train_loop
from agentenv.trainer.checkpoint import latest_checkpoint
from agentenv.trainer.setup import LoopParts
from tests.fakes import EOT, CharRenderer, CountdownEnv, recording_learner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")]

UPDATES, B = 4, 4
OVERRIDES = ["warmup.steps=0", "eval.problems=0", f"run.batch_size={B}", "run.concurrency=4", "run.max_pool_size=8",
             "run.checkpoint_every=100", "learner.micro_batch_size=4", "staleness.policy=none",
             "staleness.drift_mode=token_share", "objective.delta=100.0", "optim.step_on_zero_gradient=true",
             "model.max_batch_size=4", "rollout.max_turns=4", "rollout.max_total_tokens=4096",
             "--updates", str(UPDATES)]
PROBLEM = MathProblem("fault/0", "What is 6 times 7?", "42", "fault")
CALL = '<tool_call>{{"name": "python", "arguments": {{"code": "{}"}}}}</tool_call>'
SCRIPT = [CALL.format("x = 6 * 7"), CALL.format("print(x)"), "It is \\boxed{42}."]


def tiny_lm() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


class ToolScriptEngine:
    """The scripted policy of the python_tool runs: the reply after ``k`` replies is ``SCRIPT[k]``."""

    def __init__(self) -> None:
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context_tokens(self) -> int:
        return 100_000

    async def generate(self, prompt_ids, params: SamplingParams) -> GenerationOutput:
        await asyncio.sleep(0.05)  # the sandbox workers sit idle between calls, as with a real model
        ids = [ord(c) for c in SCRIPT[min(list(prompt_ids).count(EOT), 2)]] + [EOT]  # EOT ends each reply
        return GenerationOutput(ids, [-0.5] * len(ids), [TokenSpan(len(ids), self._version, self._version)], "stop")

    async def update_weights(self, weights, version) -> None:
        self._version = version

    async def close(self) -> None:
        pass


@pytest.fixture
def loop(tmp_path):
    """Run ``train()`` with an env factory and an engine builder; returns (summary, rows, batches)."""
    batches: list[list] = []
    reset_fault_points()

    def run(env_factory, *extra, engine=None, during=None, sync_check=True):
        parts = LoopParts(load_policy=lambda cfg, **_: (tiny_lm(), None, CharRenderer()),
                          env_factory=lambda cfg, *_: env_factory, build_learner=recording_learner(batches))
        if engine is not None:
            parts = replace(parts, build_engine=lambda cfg, model, tok: engine())
        if engine is not None or not sync_check:  # a scripted engine samples no policy
            parts = replace(parts, sync_check=lambda cfg: None)
        cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *OVERRIDES, *extra])
        run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
        stop = threading.Event()
        watcher = threading.Thread(target=during, args=(run_dir, stop), daemon=True) if during else None
        if watcher:
            watcher.start()
        try:
            summary = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=parts), 200))
        finally:
            stop.set()
            if watcher:
                watcher.join(10)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        check_accounting(run_dir, rows)
        return summary, rows, batches

    yield run
    reset_fault_points()


def check_accounting(run_dir: Path, rows: list[dict]) -> None:
    """The run did its updates, and the seeds handed out are consumed, pooled, in flight, requeued or dropped."""
    assert rows[-1]["update"] == UPDATES
    consumed = [json.loads(line)["seed"] for line in (run_dir / "staleness.jsonl").read_text().splitlines()]
    assert len(consumed) == len(rows) * B and len(set(consumed)) == len(consumed)  # none consumed twice
    state = json.loads((latest_checkpoint(run_dir / "checkpoints") / "meta.json").read_text())["extra"]
    pooled = [t["info"]["seed"] for t in state["pool"]["trajectories"]]
    tasks = state["collector"]
    accounted = consumed + pooled + tasks["in_flight"] + tasks["requeued"]
    assert len(set(accounted)) == len(accounted)  # each task in one place only
    lost = set(range(tasks["next_seed"])) - set(accounted)
    assert len(lost) == rows[-1]["episodes/dropped_tasks_total"]  # the rest were dropped, and counted


def children(marker: str) -> list[int]:
    """Pids of this process's children whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and marker in cmd:
            found.append(int(name))
    return found


def after_update(run_dir: Path, stop: threading.Event, n: int = 1) -> bool:
    """Wait until ``n`` metrics rows are written (False when the run ended first)."""
    path = run_dir / "metrics.jsonl"
    while not stop.is_set():
        if path.is_file() and len(path.read_text().splitlines()) >= n:
            return True
        time.sleep(0.01)
    return False


def python_tool_env(grader: Grader):
    return lambda: PythonToolEnv(problems=[PROBLEM], sandbox_backend="process", grader=grader, pool_size=1,
                                 grade_timeout_s=2.0, max_turns=4)


def all_rewards_one(batches) -> bool:
    return all(t.reward == 1.0 and t.status == "completed" for b in batches for t in b)


def bad_rows(batches) -> list:
    return [(t.reward, t.info) for b in batches for t in b if t.reward != 1.0 or t.status != "completed"]


def test_engine_thread_death_rebuilds_from_latest_weights_and_requeues(loop, monkeypatch):
    # the first decode step once the engine serves version 1: after the learner's first update, on any machine
    # (a count of decode steps was not: at engine.decode:12 a fast CI run had the fault before update 1)
    monkeypatch.setenv("AGENTENV_FAULT", "engine.decode:v1")
    # without the sampling check, whose probe would be the first request at version 1, not an episode's
    summary, rows, batches = loop(CountdownEnv, "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=6",
                                  "rollout.max_total_tokens=16", sync_check=False)
    assert summary["updates"] == UPDATES and not summary["interrupted"]
    last = rows[-1]
    assert last["faults/engine_rebuilds_total"] == 1 and sum(r["faults/engine_rebuilds"] for r in rows) == 1
    assert 0 < max(r["faults/engine_rebuilds_recovery_s_max"] for r in rows) < 30
    assert last["episodes/requeued_total"] >= 1  # the episodes in flight were played again ...
    assert last["episodes/failed_total"] == 0 and last["episodes/dropped_tasks_total"] == 0  # ... not failed
    (event,) = [e for e in FAULTS.events if e[0] == "engine_rebuilds"]
    _, at, _, details = event
    assert details["version"] >= 1  # rebuilt at the learner's version, not the initial weights
    after = [t for b in batches for t in b if t.start_time > at]
    assert after and all(min(s.version for s in t.segments) >= details["version"] for t in after)


def test_sandbox_workers_killed_mid_run_are_replaced(loop):
    def kill_sandboxes(run_dir, stop):
        if after_update(run_dir, stop):
            killed.extend(children(" -I -c "))
            for pid in killed:
                os.kill(pid, signal.SIGKILL)

    killed: list[int] = []
    with Grader(workers=1) as grader:
        summary, rows, batches = loop(python_tool_env(grader), engine=ToolScriptEngine, during=kill_sandboxes)
    assert summary["updates"] == UPDATES and killed
    # A replacement is counted once it said hello, maybe after the last row, and only if an episode
    # needed a sandbox after the kill: in async mode the last batches may all have been played before
    # it (1 run in 5 here), so the count is checked for consistency only; tests/sandboxes checks the
    # replacement itself.
    assert rows[-1]["faults/sandbox_replaced_total"] <= FAULTS.total("sandbox_replaced")
    assert all_rewards_one(batches), bad_rows(batches)  # a killed worker never became a reward 0 in a batch
    assert all(t.info["tool_calls"] == 2 for b in batches for t in b)


def test_an_environment_that_crashes_is_replaced_and_its_task_replayed(loop, monkeypatch):
    monkeypatch.setenv("AGENTENV_FAULT", "python_tool.step:6")
    with Grader(workers=1) as grader:
        summary, rows, batches = loop(python_tool_env(grader), engine=ToolScriptEngine)
    assert summary["updates"] == UPDATES
    last = rows[-1]
    assert last["faults/env_replaced_total"] == 1 and last["episodes/failed_total"] == 1
    assert last["episodes/retried_total"] == 1 and last["episodes/dropped_tasks_total"] == 0
    assert all_rewards_one(batches), bad_rows(batches)


def test_a_hung_grader_is_killed_and_the_answer_never_scored_zero(loop):
    def hang_grader(run_dir, stop):
        if after_update(run_dir, stop):
            stopped.extend(p for p in children(_WORKER_COMMAND) if p not in others)
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)

    # workers of graders other tests left alive in this process (the default grader's): never stopped,
    # or later tests that grade through them would time out
    others = set(children(_WORKER_COMMAND))
    stopped: list[int] = []
    with Grader(workers=1) as grader:
        summary, rows, batches = loop(python_tool_env(grader), engine=ToolScriptEngine, during=hang_grader)
        assert len(stopped) == 1 and grader.timeouts >= 1
    assert summary["updates"] == UPDATES
    assert not Path(f"/proc/{stopped[0]}").exists() or "zombie" in Path(f"/proc/{stopped[0]}/status").read_text()
    last = rows[-1]
    assert last["faults/grader_kills_total"] >= 1 and last["episodes/failed_total"] >= 1
    assert 2.0 <= max(r["faults/grader_kills_recovery_s_max"] for r in rows) < 10  # the deadline, then the kill
    assert all_rewards_one(batches), bad_rows(batches)
