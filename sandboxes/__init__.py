r"""Sandboxes: a persistent, isolated Python worker per episode.

Typical use (what ``python_tool`` does)::

    from agentenv.sandboxes import SandboxLimits, create_sandbox_pool

    pool = create_sandbox_pool(backend="auto", size=4, limits=SandboxLimits(timeout_s=10))
    await pool.start()                      # optional: warm the pool now
    sb = await pool.acquire()               # a started, never-used sandbox
    res = await sb.run("x = 1\\nprint(x)", timeout_s=5.0)   # ExecResult(status=OK, stdout="1\\n")
    await pool.release(sb)                  # closed and replaced in the background
    await pool.close()

Backends: ``"docker"`` (container from a locally built image), ``"bwrap"`` (bubblewrap namespaces),
``"process"`` (subprocess with rlimits), or ``"auto"`` (the first that works here, in that order).
``pool.backend``/``sb.backend`` and ``pool.isolation``/``sb.isolation`` say what was chosen;
:func:`backend_report` gives the full picture.
"""

from agentenv.sandboxes.base import ExecResult, ExecStatus, Sandbox, SandboxLimits
from agentenv.sandboxes.pool import SandboxPool, create_sandbox, create_sandbox_pool
from agentenv.sandboxes.select import available_backends, backend_report, choose_backend
from agentenv.sandboxes.session import WorkerSandbox

__all__ = [
    "ExecResult",
    "ExecStatus",
    "Sandbox",
    "SandboxLimits",
    "SandboxPool",
    "WorkerSandbox",
    "available_backends",
    "backend_report",
    "choose_backend",
    "create_sandbox",
    "create_sandbox_pool",
]
