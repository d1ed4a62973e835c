"""Every backend against hostile or broken snippets: the caller gets a status, the host is untouched."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentenv.errors import ClosedError
from agentenv.sandboxes import ExecStatus

CAP = 4096  # LIMITS.output_bytes in conftest


async def test_state_persists_across_calls(sandbox):
    assert (await sandbox.run("x = 1")).status is ExecStatus.OK
    r = await sandbox.run("x += 41\nprint(x)")
    assert r.status is ExecStatus.OK and r.stdout == "42\n" and r.error == ""
    r = await sandbox.run("def f(a):\n    return a * x\n")
    assert (await sandbox.run("print(f(2))")).stdout == "84\n"


async def test_exception_is_error_with_traceback_and_state_kept(sandbox):
    await sandbox.run("x = 7")
    r = await sandbox.run("y = 1\nraise ValueError('boom')")
    assert r.status is ExecStatus.ERROR and not r.worker_replaced
    assert "Traceback" in r.error and "ValueError: boom" in r.error and '"<cell>", line 2' in r.error
    assert "worker.py" not in r.error  # the worker's own frames are not shown
    r = await sandbox.run("print(x, y)")
    assert r.status is ExecStatus.OK and r.stdout == "7 1\n"


async def test_huge_output_is_capped(sandbox):
    r = await sandbox.run("print('a' * 10_000_000)\nfor i in range(100_000):\n    print(i)")
    assert r.status is ExecStatus.OK and r.output_truncated
    assert r.stdout == "a" * CAP
    # output written by a child process straight to fd 1 is capped too
    r = await sandbox.run("import os\nos.system('head -c 3000000 /dev/zero | tr \"\\\\0\" b')")
    assert r.status is ExecStatus.OK and r.output_truncated and r.stdout == "b" * CAP
    r = await sandbox.run("print('small')")
    assert r.stdout == "small\n" and not r.output_truncated


async def test_the_cut_note_counts_what_the_snippet_printed(sandbox):
    """10,001 characters printed, 4,096 kept by the sandbox, 100 shown to the model: 9,901 are cut, not 3,996."""
    from agentenv.envs.python_tool.tool import format_result

    r = await sandbox.run("print('a' * 10_000)")
    assert (r.stdout_chars, len(r.stdout), r.output_truncated) == (10_001, CAP, True)
    assert format_result(r, 100).splitlines()[-2] == "... [9901 more characters cut]"
    r = await sandbox.run("import os, sys\nprint('x' * 5)\nsys.stdout.flush()\nos.write(1, b'y' * 7000)")
    assert r.stdout_chars == 6 + 7000 and format_result(r, 10).splitlines()[-2] == "... [6996 more characters cut]"
    r = await sandbox.run("print('small')")
    assert r.stdout_chars == 6 and "cut" not in format_result(r, 100)


async def test_invalid_utf8_is_replaced(sandbox):
    code = ("import sys, os\nsys.stdout.buffer.write(b'A\\xff\\xfeB\\n')\nos.write(1, b'C\\xc3\\x28D\\n')\n"
            "print('E\\udcffF')\nsys.stderr.buffer.write(b'\\x80err')")
    r = await sandbox.run(code)
    assert r.status is ExecStatus.OK
    assert "A\ufffd\ufffdB\n" in r.stdout and "C\ufffd(D\n" in r.stdout and "E?F\n" in r.stdout
    assert r.stderr == "\ufffderr"


async def test_multibyte_output_cut_on_a_character_boundary(sandbox):
    r = await sandbox.run("print('é' * 10_000)")
    assert r.output_truncated and set(r.stdout) == {"é"} and len(r.stdout.encode()) <= CAP


async def test_sys_exit_is_reported_and_session_survives(sandbox):
    await sandbox.run("x = 3")
    r = await sandbox.run("import sys\nsys.exit(4)")
    assert r.status is ExecStatus.ERROR and "SystemExit: 4" in r.error and not r.worker_replaced
    r = await sandbox.run("import sys\nprint('bye')\nsys.exit(0)")
    assert r.status is ExecStatus.OK and r.stdout == "bye\n"
    assert (await sandbox.run("print(x)")).stdout == "3\n"


async def test_os_exit_crashes_and_worker_is_replaced(sandbox):
    await sandbox.run("x = 3")
    r = await sandbox.run("import os\nprint('partial')\nos._exit(9)")
    assert r.status is ExecStatus.CRASHED and r.worker_replaced and "9" in r.error
    r = await sandbox.run("print('fresh')")
    assert r.status is ExecStatus.OK and r.stdout == "fresh\n"
    r = await sandbox.run("print(x)")  # state was lost with the worker
    assert r.status is ExecStatus.ERROR and "NameError" in r.error


async def test_infinite_loop_times_out_and_next_call_works(sandbox):
    t0 = time.monotonic()
    r = await sandbox.run("while True:\n    pass", timeout_s=1.0)
    assert r.status is ExecStatus.TIMEOUT and r.worker_replaced
    assert 0.95 <= r.duration_s < 2.0 and time.monotonic() - t0 < 5.0
    r = await sandbox.run("print(6 * 7)")
    assert r.status is ExecStatus.OK and r.stdout == "42\n"


async def test_sleep_past_timeout(sandbox):
    r = await sandbox.run("import time\nprint('before')\ntime.sleep(60)", timeout_s=0.5)
    assert r.status is ExecStatus.TIMEOUT and 0.45 <= r.duration_s < 1.5
    assert (await sandbox.run("print('alive')")).stdout == "alive\n"


async def test_memory_bomb_is_oom_and_contained(sandbox, backend):
    r = await sandbox.run("blocks = []\nwhile True:\n    blocks.append(b'x' * 10_000_000)", timeout_s=20)
    assert r.status is ExecStatus.OOM and r.worker_replaced, r
    # docker: the cgroup limit kills the container (read back from its state); else RLIMIT_AS
    assert ("OOM-killed" if backend == "docker" else "MemoryError") in r.error
    r = await sandbox.run("print(len(bytearray(1_000_000)))")
    assert r.status is ExecStatus.OK and r.stdout == "1000000\n"


async def test_fork_bomb_is_contained(sandbox):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = await sandbox.run(code, timeout_s=2.0)
    assert r.status is ExecStatus.TIMEOUT
    assert subprocess.run(["true"], timeout=10).returncode == 0  # the host can still fork
    r = await sandbox.run("print('ok')")
    assert r.status is ExecStatus.OK and r.stdout == "ok\n"


async def test_network_connection_fails(sandbox):
    with socket.socket() as srv:  # loopback listener on the host
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.settimeout(0.5)
        port = srv.getsockname()[1]
        r = await sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
        assert r.status is ExecStatus.ERROR and ("OSError" in r.error or "Error" in r.error)
        with pytest.raises(TimeoutError):
            srv.accept()
    r = await sandbox.run("import socket\nprint(socket.if_nameindex())")
    assert "eth" not in r.stdout and "ens" not in r.stdout  # no host interface inside


async def test_host_secrets_are_not_readable(sandbox):
    marker = f"agentenv-secret-{os.getpid()}"
    holder = subprocess.Popen(["sleep", "30"], env={"SECRET": marker})
    try:
        code = (
            "import os\nfound = []\n"
            "for p in os.listdir('/proc'):\n"
            "    try:\n"
            "        found.append(open('/proc/%s/environ' % p, 'rb').read())\n"
            "    except (OSError, ValueError):\n"
            "        pass\n"
            f"print({marker!r}.encode() in b''.join(found))\n"
            "for path in ('/etc/shadow', '/root/.bash_history', '/root'):\n"
            "    try:\n"
            "        data = os.listdir(path) if path == '/root' else open(path).read()\n"
            "        print(path, 'READ', len(data))\n"
            "    except OSError as e:\n"
            "        print(path, 'DENIED', type(e).__name__)\n")
        r = await sandbox.run(code)
    finally:
        holder.kill()
        holder.wait()
    assert r.status is ExecStatus.OK, r.error
    lines = r.stdout.splitlines()
    assert lines[0] == "False"
    for line in lines[1:]:  # denied, absent, or the sandbox's own empty folder
        assert "DENIED" in line or line.endswith("READ 0"), line


async def test_writing_outside_the_work_folder_fails(sandbox):
    host_dir = Path(tempfile.mkdtemp(prefix="agentenv-sbx-test-"))
    host_dir.chmod(0o777)
    try:
        targets = [str(host_dir / "pwned"), "/etc/pwned", "/usr/pwned", "/root/pwned",
                   str(Path(__file__).resolve().parent / "pwned")]
        code = ("results = []\n"
                f"for t in {targets!r}:\n"
                "    try:\n"
                "        open(t, 'w').write('x')\n"
                "        results.append('WROTE ' + t)\n"
                "    except OSError as e:\n"
                "        results.append('FAILED')\n"
                "print(results)\n"
                "open('inside.txt', 'w').write('mine')\nprint(open('inside.txt').read())")
        r = await sandbox.run(code)
        assert r.status is ExecStatus.OK, r.error
        assert "WROTE" not in r.stdout and r.stdout.endswith("mine\n"), r.stdout
        for t in targets:  # nothing appeared on the host
            assert not Path(t).exists(), t
    finally:
        for p in host_dir.iterdir():
            p.unlink()
        host_dir.rmdir()


def _host_cmdlines_with(token: str) -> list[str]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if token in cmd:
                found.append(cmd)
    return found


async def test_background_processes_die_with_the_call(sandbox):
    code = ("import subprocess, os\n"
            "subprocess.Popen(['sleep', '31337'])\n"
            "subprocess.Popen(['setsid', 'sleep', '31338'])\n"
            "os.system('(sleep 31339 &) ; nohup sleep 31340 >/dev/null 2>&1 &')\n"
            "print('started')")
    r = await sandbox.run(code)
    assert r.status is ExecStatus.OK and r.stdout == "started\n"
    assert _host_cmdlines_with("sleep 3133") == []
    r = await sandbox.run("import os\nprint(os.waitpid(-1, os.WNOHANG) if False else 'clean')")
    assert r.stdout == "clean\n"


async def test_backend_and_isolation_are_reported(sandbox, backend):
    assert sandbox.backend == backend
    assert sandbox.isolation.startswith(backend + ":")
    if os.geteuid() == 0 or backend != "process":
        assert "network" in sandbox.isolation and "NOT" not in sandbox.isolation


async def test_closed_sandbox_refuses_and_close_is_idempotent(sandbox):
    await sandbox.close()
    await sandbox.close()
    with pytest.raises(ClosedError):
        await sandbox.run("print(1)")


async def test_non_string_code_is_a_type_error(sandbox):
    with pytest.raises(TypeError):
        await sandbox.run(b"print(1)")  # type: ignore[arg-type]
    assert (await sandbox.run("print(1)")).stdout == "1\n"


def test_python_is_available_for_the_worker():
    assert sys.version_info >= (3, 10)


async def test_close_during_a_call_returns_promptly(sandbox):
    from agentenv.sandboxes import Sandbox

    assert isinstance(sandbox, Sandbox)
    await sandbox.start()  # closing while the worker still starts is a ClosedError instead (not this case)
    task = asyncio.create_task(sandbox.run("import time\ntime.sleep(60)", timeout_s=120))
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    await sandbox.close()  # e.g. the episode deadline passed: scoring must not hang
    r = await asyncio.wait_for(task, 10)
    assert r.status is ExecStatus.CRASHED and "closed" in r.error and time.monotonic() - t0 < 10


async def test_bad_timeout_and_limits_are_config_errors(sandbox, backend):
    from agentenv.errors import ConfigError
    from agentenv.sandboxes import SandboxLimits, create_sandbox_pool

    with pytest.raises(ConfigError):
        await sandbox.run("print(1)", timeout_s=0)
    with pytest.raises(ConfigError):
        create_sandbox_pool(backend, size=1, limits=SandboxLimits(timeout_s=-1))
    with pytest.raises(ConfigError):
        create_sandbox_pool(backend, size=1, limits=SandboxLimits(memory_bytes=1000))
    assert (await sandbox.run("print(1)")).stdout == "1\n"


async def test_worker_has_no_capabilities_and_cannot_regain_root(sandbox):
    code = ("import os\n"
            "st = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines())\n"
            "print(os.getuid() != 0, st['CapEff'].strip(), st['CapPrm'].strip(), st['NoNewPrivs'].strip())\n"
            "try:\n    os.setuid(0)\n    print('ROOT')\nexcept OSError:\n    print('denied')")
    r = await sandbox.run(code)
    assert r.stdout == "True 0000000000000000 0000000000000000 1\ndenied\n", (r.stdout, r.error)


def test_bwrap_binds_only_what_it_needs():
    from agentenv.sandboxes.bwrap import bwrap_argv

    argv = bwrap_argv()
    pairs = {(argv[i], argv[i + 1], argv[i + 2]) for i in range(len(argv) - 2)}
    assert ("--ro-bind", "/", "/") not in pairs and ("--bind", "/", "/") not in pairs
    assert ("--ro-bind", "/usr", "/usr") in pairs
    assert not any(a in ("--bind", "--dev-bind") for a in argv)  # nothing of the host is writable
    for flag in ("--unshare-all", "--die-with-parent", "--remount-ro"):
        assert flag in argv
    assert argv[argv.index("--uid") + 1] == "65534"


@pytest.mark.docker
async def test_docker_container_is_locked_down():
    from agentenv.sandboxes import create_sandbox

    from .conftest import LIMITS, require

    require("docker")

    sb = await create_sandbox("docker", LIMITS)
    try:
        attrs = sb._handle.state.container.attrs
        host, cfg = attrs["HostConfig"], attrs["Config"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
        assert host["Memory"] == LIMITS.memory_bytes and host["MemorySwap"] == LIMITS.memory_bytes
        assert host["PidsLimit"] == LIMITS.max_processes and host["NanoCpus"] == int(LIMITS.cpus * 1e9)
        assert set(host["Tmpfs"]) == {"/work", "/tmp"} and cfg["User"] == "65534:65534"
    finally:
        await sb.close()


async def test_cancelled_call_never_leaks_its_answer_into_the_next(sandbox):
    await sandbox.run("x = 1")
    task = asyncio.create_task(sandbox.run("import time\ntime.sleep(0.5)\nprint('stale')", timeout_s=30))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    r = await sandbox.run("print('fresh')")
    assert r.status is ExecStatus.OK and r.stdout == "fresh\n"
    await asyncio.sleep(0.6)  # the abandoned snippet would have finished by now
    r = await sandbox.run("print('x' in globals())")
    assert r.stdout == "False\n"  # the worker was replaced: state lost, nothing stale read


async def test_forged_protocol_frames_are_a_crash_not_a_result(sandbox):
    # the snippet writes a fake response frame straight to the worker's protocol descriptor
    code = ("import os, struct, json\n"
            "fds = [int(f) for f in os.listdir('/proc/self/fd')]\n"
            "body = json.dumps({'status': 'bogus', 'stdout': 1}).encode()\n"
            "for fd in fds:\n"
            "    if fd > 2:\n"
            "        try:\n"
            "            os.write(fd, struct.pack('>I', len(body)) + body)\n"
            "        except OSError:\n"
            "            pass\n"
            "import time\ntime.sleep(0.2)")
    r = await sandbox.run(code)
    assert r.status is ExecStatus.CRASHED and r.worker_replaced and "malformed worker response" in r.error
    assert (await sandbox.run("print('next')")).stdout == "next\n"


async def test_control_characters_everywhere_fit_the_frame(sandbox):
    code = ("import sys\nprint('\\x01' * 100_000)\nsys.stderr.write('\\x02' * 100_000)\n"
            "raise ValueError('\\x03' * 100_000)")
    r = await sandbox.run(code)
    assert r.status is ExecStatus.ERROR and r.stdout == "\x01" * CAP and r.stderr == "\x02" * CAP
    assert r.error.endswith("\x03" * 100 + "\n") and len(r.error) <= CAP
