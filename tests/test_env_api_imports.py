"""The environment API stays light: a plugin author's ``import agentenv`` loads no model-side package.

``agentenv`` (core, registration, errors, checker, text spaces and the Gymnasium adapter) and building a
shipped environment with ``make`` must not import torch, transformers, the sandbox's docker client, the
HTTP server or client, or the tool-task generator; they load when a run, a server or a task needs them.
Checked in a fresh interpreter, where nothing else has imported them.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "docker", "starlette", "uvicorn", "httpx", "reasoning_gym", "vllm", "deepspeed")

PROBE = """
import json, sys
import agentenv
import agentenv.checker, agentenv.gym_adapter
env = agentenv.make("python_tool", sandbox_backend="process")
print(json.dumps(sorted(name for name in {heavy!r} if name in sys.modules)))
"""


def test_the_env_api_and_make_load_no_model_side_package():
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)], capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_probe_sees_a_heavy_import():
    # the check can fail: a module that imports torch shows up in the list
    probe = PROBE.replace("import agentenv\n", "import agentenv\nimport agentenv.trainer.learners.single\n")
    out = subprocess.run([sys.executable, "-c", probe.format(heavy=HEAVY)], capture_output=True, text=True,
                         timeout=120, check=True)
    assert "torch" in json.loads(out.stdout.strip().splitlines()[-1])
