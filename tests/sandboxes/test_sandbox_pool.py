"""The warm pool, backend choice and the queue-wait rule, on real workers."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentenv.errors import ClosedError, ConfigError
from agentenv.sandboxes import (
    ExecStatus,
    SandboxLimits,
    available_backends,
    backend_report,
    choose_backend,
    create_sandbox,
    create_sandbox_pool,
)
from agentenv.sandboxes.hostproc import UID_BASE, pids_of_uid

from .conftest import LIMITS


async def test_warm_pool_hands_out_started_fresh_sandboxes_without_waiting(backend):
    pool = create_sandbox_pool(backend, size=2, limits=LIMITS)
    await pool.start()
    try:
        assert pool._ready.qsize() == 2 and pool.backend == backend and pool.isolation.startswith(backend)
        a = await pool.acquire()
        b = await pool.acquire()
        assert pool.waits == 0 and a.ready and b.ready and a is not b and a.calls == 0
        t0 = time.monotonic()
        r = await a.run("x = 'a'\nprint(x)")
        assert r.stdout == "a\n" and time.monotonic() - t0 < 1.0
        assert "NameError" in (await b.run("print(x)")).error  # no state shared between sandboxes
        await pool.release(a)
        with pytest.raises(ClosedError):
            await a.run("print(1)")
        for _ in range(100):  # bounded: the pool refills to 2 in the background
            if pool._ready.qsize() == 2:
                break
            await asyncio.sleep(0.1)
        assert pool._ready.qsize() == 2
        c = await pool.acquire()
        assert pool.waits == 0 and c.calls == 0
        assert "NameError" in (await c.run("print(x)")).error  # a released sandbox is never reused
    finally:
        await pool.close()


async def test_cold_pool_starts_on_demand_and_counts_the_wait():
    pool = create_sandbox_pool("process", size=0, limits=LIMITS)
    sb = await pool.acquire()
    assert pool.waits == 1 and (await sb.run("print(5)")).stdout == "5\n"
    await pool.close()
    with pytest.raises(ClosedError):
        await sb.run("print(1)")  # close() closes handed-out sandboxes too
    with pytest.raises(ClosedError):
        await pool.acquire()
    await pool.close()  # idempotent


async def test_crashed_sandbox_in_pool_recovers_and_pool_close_kills_everything():
    pool = create_sandbox_pool("process", size=2, limits=LIMITS)
    await pool.start()
    sb = await pool.acquire()
    r = await sb.run("import os\nos._exit(1)")
    assert r.status is ExecStatus.CRASHED
    assert (await sb.run("print('again')")).stdout == "again\n"
    await pool.close()
    import os

    if os.geteuid() == 0:  # every private uid of this test process is gone
        base = UID_BASE + (os.getpid() % 4096) * 4096
        left = [u for u in range(base, base + 64) if pids_of_uid(u)]
        assert left == []


async def test_queue_wait_does_not_count_against_the_time_limit():
    # 3 x 0.7 s queued on one worker is 2.1 s, past the 2 s limit of each call; the margin above
    # 0.7 s keeps a loaded CI machine from timing a call out for its own slowness.
    sb = await create_sandbox("process", SandboxLimits(timeout_s=2.0))
    try:
        code = "import time\ntime.sleep(0.7)\nprint('done')"
        results = await asyncio.gather(*(sb.run(code) for _ in range(3)))
        assert [r.status for r in results] == [ExecStatus.OK] * 3
        assert all(0.65 <= r.duration_s < 2.0 for r in results)
    finally:
        await sb.close()


async def test_concurrent_sandboxes_are_independent():
    pool = create_sandbox_pool("process", size=4, limits=LIMITS)
    await pool.start()
    try:
        sbs = [await pool.acquire() for _ in range(6)]
        await asyncio.gather(*(sb.run(f"v = {i}") for i, sb in enumerate(sbs)))
        outs = await asyncio.gather(*(sb.run("print(v * 10)") for sb in sbs))
        assert [o.stdout for o in outs] == [f"{i * 10}\n" for i in range(6)]
        assert pool.waits <= 2  # 4 were warm; the pool may have refilled one or two meanwhile
    finally:
        await pool.close()


def test_choose_backend_order_and_errors():
    avail = available_backends()
    expected = next(b for b in ("docker", "bwrap", "process") if not avail[b])
    assert choose_backend("auto") == expected
    assert choose_backend("process") == "process"
    with pytest.raises(ConfigError):
        choose_backend("vm")
    with pytest.raises(ConfigError):
        create_sandbox_pool("vm")
    with pytest.raises(ConfigError):
        create_sandbox_pool("process", size=-1)
    report = backend_report()
    assert report["backend"] == expected and report["process_available"] == "yes"
    assert set(report) >= {"requested", "backend", "isolation", "docker_available", "bwrap_available"}


async def test_auto_sandbox_reports_what_it_chose():
    async with await create_sandbox("auto", LIMITS) as sb:
        assert sb.backend == choose_backend("auto") and sb.isolation
        assert (await sb.run("print('auto')")).stdout == "auto\n"


def test_cli_info_and_usage(capsys):
    from agentenv.sandboxes.cli import main

    assert main(["info"]) == 0
    assert f"backend: {choose_backend('auto')}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


async def test_a_backend_that_cannot_start_raises_sandbox_error_everywhere():
    from agentenv.errors import SandboxError
    from agentenv.sandboxes import SandboxPool, WorkerSandbox
    from agentenv.sandboxes.process import ProcessLauncher

    broken = ProcessLauncher(LIMITS, python="/nonexistent/python3")
    with pytest.raises(SandboxError, match="nonexistent"):
        await WorkerSandbox(broken, LIMITS).start()
    pool = SandboxPool(broken, LIMITS, size=2)
    with pytest.raises(SandboxError, match="do not start"):
        await pool.start()
    with pytest.raises(SandboxError, match="nonexistent"):
        await pool.acquire()
    await pool.close()


def test_build_image_without_a_daemon_fails_cleanly(monkeypatch, capsys):
    from agentenv.sandboxes.cli import main

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/agentenv-test.sock")
    assert main(["build-image"]) == 1
    assert "no Docker daemon answers" in capsys.readouterr().err
    assert choose_backend("auto") in ("bwrap", "process")


@pytest.mark.docker
def test_build_image_finds_the_built_image(capsys):
    from agentenv.sandboxes.cli import main
    from agentenv.sandboxes.image import IMAGE

    from .conftest import require

    require("docker")
    assert main(["build-image"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == IMAGE and "already built" in out.err
