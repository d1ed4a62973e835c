"""``kill -9`` a real ``agentenv train`` at several moments, ``--resume`` it each time, and account for every task.

The run is a real subprocess ``python -m agentenv.cli train`` (``agentenv train``) on the smallest
real config: ``recipes/generic_cpu.yaml`` (asynchronous FlashREINFORCE + PACE, requeued rejections)
with a tiny random Llama saved beside the default tokenizer, and ``tests.tiny_env.RepeatNumberEnv``
installed as a plugin by hand (a ``.dist-info`` folder with an ``agentenv.envs`` entry point), whose
task id is the collector's task seed. The kills land, in order:

1. mid-update (``AGENTENV_PAUSE_AT=update:4``: the 4th optimizer step done, nothing of it logged;
   update 3 was logged after the v2 checkpoint, so its lines must be cut);
2. mid-checkpoint-write (``checkpoint:1``: v4's files in its temporary folder, not yet published);
3. right after a checkpoint (``saved:1``: ``latest`` names v4);
4. wherever the loop is once ``metrics.jsonl`` has 7 lines (no pause point);

and a last ``--resume`` finishes the 10 updates. Checked from the run's own files: every update is
logged once; each task is consumed once at most and ``U * B`` are consumed, as in an uninterrupted run;
the tasks consumed, pooled, in flight and requeued at the final checkpoint are exactly the seeds handed
out, none twice; each resume requeued the tasks its checkpoint had in flight and counted them in the
metrics; a kill mid-write left the previous checkpoint intact and ``latest`` on it. About 90 s on 2 cores
(five process starts: imports dominate).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentenv.trainer.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
U, B, EVERY = 10, 4, 2
OVERRIDES = [
    "--recipe", "generic_cpu", "--env", "tests/RepeatNumber-v0", "--updates", str(U),
    f"run.batch_size={B}", "run.concurrency=4", "run.max_pool_size=16", f"run.checkpoint_every={EVERY}",
    "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=4", "rollout.max_total_tokens=32",
    "learner.micro_batch_size=4", "model.max_batch_size=4",
    "optim.step_on_zero_gradient=true",  # every batch steps, so batches, updates and versions coincide
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A tiny random model folder (default tokenizer) and a plugin folder registering RepeatNumberEnv."""
    from transformers import AutoTokenizer

    from agentenv.models import chat_template, default_model_dir, tiny_random_model

    tmp = tmp_path_factory.mktemp("resume_kill")
    model = tmp / "model"
    tiny_random_model(hidden_size=32, max_position_embeddings=256).save_pretrained(model)
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir(), local_files_only=True)
    tokenizer.chat_template = chat_template()
    tokenizer.save_pretrained(model)
    site = tmp / "site"
    (site / "resume_kill_plugin-0.dist-info").mkdir(parents=True)
    # every reset takes 1 s: 4 episodes at a time deliver a batch about every second, slower than the
    # learner takes it, so the pool never fills up and episodes are in flight whenever a checkpoint is
    # taken (with instant episodes the pool could be full, and nothing in flight, at every checkpoint)
    (site / "resume_kill_plugin.py").write_text(
        "import asyncio\n\nfrom agentenv import register\nfrom tests.tiny_env import RepeatNumberEnv\n\n\n"
        "class SlowStartRepeatNumberEnv(RepeatNumberEnv):\n"
        "    async def reset(self, *, seed=None, options=None):\n"
        "        await asyncio.sleep(1.0)\n"
        "        return await super().reset(seed=seed, options=options)\n\n\n"
        "def register_envs():\n"
        "    register('tests/RepeatNumber-v0', 'resume_kill_plugin:SlowStartRepeatNumberEnv')\n")
    (site / "resume_kill_plugin-0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: resume-kill-plugin\nVersion: 0\n")
    (site / "resume_kill_plugin-0.dist-info" / "entry_points.txt").write_text(
        "[agentenv.envs]\nrepeat_number = resume_kill_plugin:register_envs\n")
    return model, site


class Run:
    """One ``agentenv train`` process of the run folder, stderr to a file."""

    def __init__(self, run_dir: Path, installed, *, resume: bool, pause: str | None = None) -> None:
        model, site = installed
        self.run_dir = run_dir
        self.stderr = run_dir.parent / f"stderr-{time.monotonic_ns()}.txt"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "OMP_NUM_THREADS": "1",
               "AGENTENV_PAUSE_AT": pause or ""}
        argv = ["--run-dir", str(run_dir), "--resume"] if resume else \
            [*OVERRIDES, "--run-dir", str(run_dir), f"model.name={model}"]
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "agentenv.cli", "train", *argv], cwd=REPO, env=env,
                                         stdout=subprocess.DEVNULL, stderr=err)

    def log(self) -> str:
        return self.stderr.read_text()

    def wait_for(self, cond, what: str, timeout: float = 150.0) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                raise AssertionError(f"the run exited ({self.proc.returncode}) before {what}:\n{self.log()[-3000:]}")
            if time.monotonic() > end:
                self.proc.kill()
                raise AssertionError(f"no {what} within {timeout} s:\n{self.log()[-3000:]}")
            time.sleep(0.01)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL

    def paused_then_killed(self, point: str) -> None:
        self.wait_for(lambda: f"agentenv: paused at {point}" in self.log(), f"pause at {point}")
        self.kill()

    def finish(self) -> None:
        rc = self.proc.wait(240)
        assert rc == 0, self.log()[-3000:]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def run_state(ckpt: Path) -> dict:
    return json.loads((ckpt / "meta.json").read_text())["extra"]


def test_kill_9_at_any_moment_then_resume_loses_and_repeats_no_task(installed, tmp_path):
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    at = []  # per resume: the run state of the checkpoint it resumes from

    # 1. mid-update: the 4th step is done in memory, update 3 logged after the v2 checkpoint
    r = Run(run, installed, resume=False, pause="update:4")
    r.paused_then_killed("update 4")
    assert latest_checkpoint(ckpts).name == "v00000002"
    assert [m["update"] for m in lines(run / "metrics.jsonl")] == [1, 2, 3]
    at.append(run_state(latest_checkpoint(ckpts)))

    # 2. mid-write of v4: the previous checkpoint stays intact and `latest` on it
    r = Run(run, installed, resume=True, pause="checkpoint:1")
    r.paused_then_killed("checkpoint 1")
    partial = [p.name for p in ckpts.iterdir() if p.name.startswith(".tmp-")]
    assert len(partial) == 1 and (ckpts / partial[0] / "model.safetensors").is_file()
    assert not (ckpts / partial[0] / "meta.json").exists()
    assert latest_checkpoint(ckpts).name == "v00000002" and [p.name for p in list_checkpoints(ckpts)] == [
        "v00000002"]
    assert load_checkpoint(ckpts, model=None, restore_rng=False).version == 2  # every checksum verified
    assert [m["update"] for m in lines(run / "metrics.jsonl")] == [1, 2, 3, 4]
    at.append(run_state(latest_checkpoint(ckpts)))

    # 3. right after v4 is published
    r = Run(run, installed, resume=True, pause="saved:1")
    r.paused_then_killed("saved 1")
    assert latest_checkpoint(ckpts).name == "v00000004"
    assert not any(p.name.startswith(".tmp-") for p in ckpts.iterdir())  # removed by the resume of 3.
    at.append(run_state(latest_checkpoint(ckpts)))

    # 4. wherever the loop is once update 7 is logged
    r = Run(run, installed, resume=True)
    r.wait_for(lambda: len(lines(run / "metrics.jsonl")) >= 7, "update 7")
    r.kill()
    assert latest_checkpoint(ckpts).name in ("v00000006", "v00000008")
    at.append(run_state(latest_checkpoint(ckpts)))

    # 5. to the end
    Run(run, installed, resume=True).finish()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == U and not summary["interrupted"]

    # every update logged once, after the resumes cut what was written past their checkpoints
    rows = lines(run / "metrics.jsonl")
    assert [m["update"] for m in rows] == list(range(1, U + 1))
    assert all(m["episodes/dropped_tasks_total"] == 0 for m in rows)
    resumes = lines(run / "resumes.jsonl")
    assert [x["checkpoint"] for x in resumes[:3]] == ["v00000002", "v00000002", "v00000004"]
    assert resumes[0]["discarded_lines"]["metrics.jsonl"] == 1  # update 3
    assert resumes[0]["discarded_lines"]["staleness.jsonl"] == B
    assert resumes[1]["discarded_lines"]["metrics.jsonl"] == 2  # updates 3 and 4, again
    assert resumes[1]["removed"] == partial  # the unfinished save of v4
    assert "metrics.jsonl" not in resumes[2]["discarded_lines"]  # killed right after the save: nothing to cut
    # each resume requeued exactly the tasks its checkpoint had in flight, and the metrics count them
    # along the history the logs keep (resume 2 started from v2 again: resume 1's requeues were undone)
    assert [x["requeued_tasks"] for x in resumes] == [s["collector"]["in_flight"] for s in at]
    assert sum(len(x["requeued_tasks"]) for x in resumes) > 0
    assert [x["requeued_total"] for x in resumes] == [
        s["resumes"]["requeued_tasks"] + len(s["collector"]["in_flight"]) for s in at]
    assert [x["count"] for x in resumes] == [s["resumes"]["count"] + 1 for s in at]
    assert [s["resumes"]["count"] for s in at[:3]] == [0, 0, 1]
    assert rows[-1]["resume/count"] == resumes[-1]["count"] == 3
    assert rows[-1]["resume/requeued_tasks_total"] == resumes[-1]["requeued_total"]

    # tasks: B per update, each consumed at most once, as in an uninterrupted run
    consumed = lines(run / "staleness.jsonl")
    assert collections.Counter(c["version"] for c in consumed) == dict.fromkeys(range(U), B)
    seeds = [c["seed"] for c in consumed]
    assert [str(s) for s in seeds] == [c["task_id"] for c in consumed]
    repeated = [s for s, n in collections.Counter(seeds).items() if n > 1]
    assert repeated == [] and len(seeds) == U * B
    # ... and none lost: consumed + pooled + in flight + requeued at the end are the seeds handed out, once each
    final = run_state(latest_checkpoint(ckpts))
    pooled = [t["info"]["seed"] for t in final["pool"]["trajectories"]]
    tasks = final["collector"]
    accounted = seeds + pooled + tasks["in_flight"] + tasks["requeued"]
    assert sorted(accounted) == list(range(tasks["next_seed"]))
