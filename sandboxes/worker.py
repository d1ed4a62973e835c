"""The worker that runs inside every sandbox: a persistent Python namespace fed over stdin/stdout.

This file is a standalone script (standard library only, Python >= 3.8) so that the same text runs in
the Docker image's Debian ``python3``, under bubblewrap and as a plain subprocess. The host starts it as
``python3 -I -c <this source> <config json>``.

Protocol (all integers big-endian):
    frame     = length (4 bytes, unsigned) + UTF-8 JSON object of that many bytes
    worker -> host, once after start-up:  {"ready": true, "pid": int, "uid": int, "netns": bool,
                                           "mountns": bool}
    host -> worker, one per snippet:      {"code": str, "cap": int (bytes of stdout and of stderr kept)}
    worker -> host, one per snippet:      {"status": "ok"|"error"|"oom", "stdout": str, "stderr": str,
                                           "error": str, "truncated": bool}

Start-up (config keys, all optional): ``unshare`` (root only: new mount + network namespace, the
root mount read-only, private tmpfs on /tmp, /var/tmp, /dev/shm, /run/lock), ``uid`` (drop to this
uid/gid, root only), ``rlimits`` (``{"AS": bytes, "NPROC": n, "FSIZE": bytes, "CPU": seconds}``),
``workdir`` (chdir there).

Snippet output written through ``sys.stdout``/``sys.stderr`` is kept in memory up to the cap; output
written to file descriptors 1 and 2 directly (``os.write``, child processes) lands in memory files
that are read back up to the cap. The protocol uses private duplicates of the original descriptors, so
a snippet cannot corrupt it. After each snippet every process it left behind is killed (the worker is
a child subreaper, so even daemonised grandchildren come back to it).
"""

import ctypes
import io
import json
import os
import signal
import struct
import sys
import traceback

_HEADER = struct.Struct(">I")
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 36, 38
_WORKER_PID = [0]


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _setup(cfg):
    """Apply namespaces, uid, rlimits and working folder; return what was achieved."""
    libc = _libc()
    got = {"netns": False, "mountns": False, "rootro": False}
    if cfg.get("unshare") and os.geteuid() == 0 and libc is not None:
        if libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET) == 0:
            got["netns"] = got["mountns"] = True
            libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)
            # the root mount read-only in this namespace only; then private writable tmpfs folders
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
            got["rootro"] = libc.mount(b"none", b"/", None, flags, None) == 0
            for path in (b"/tmp", b"/var/tmp", b"/dev/shm", b"/run/lock"):
                if os.path.isdir(path):
                    opts = b"size=%d,mode=1777" % int(cfg.get("tmpfs_bytes", 64 << 20))
                    libc.mount(b"tmpfs", path, b"tmpfs", _MS_NOSUID | _MS_NODEV, opts)
        elif libc.unshare(_CLONE_NEWNET) == 0:
            got["netns"] = True
    if "workdir" in cfg:
        os.makedirs(cfg["workdir"], exist_ok=True)
        os.chdir(cfg["workdir"])
    uid = cfg.get("uid")
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if libc is not None:
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    import resource

    for name, value in (cfg.get("rlimits") or {}).items():
        res = getattr(resource, "RLIMIT_" + name)
        value = int(value)
        _soft, hard = resource.getrlimit(res)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(res, (value, value))
    return got


class _Capped(io.TextIOBase):
    """A text stream that keeps the first ``cap`` characters; ``written`` counts every character written."""

    def __init__(self, cap):
        super().__init__()
        self.cap, self.parts, self.size, self.truncated, self.written = cap, [], 0, False, 0
        self.buffer = _CappedBytes(self)

    def writable(self):
        return True

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        n = len(s)
        self.written += n
        room = self.cap - self.size
        if n > room:
            self.truncated = True
            s = s[: max(room, 0)]
        if s:
            self.parts.append(s)
            self.size += len(s)
        return n  # all of it "written": callers must not retry what the cap dropped

    @property
    def encoding(self):
        return "utf-8"

    def isatty(self):
        return False

    def value(self):
        data = "".join(self.parts).encode("utf-8", "replace")
        if len(data) > self.cap:
            self.truncated = True
            data = data[: self.cap]
        return data.decode("utf-8", "ignore")


class _CappedBytes(io.RawIOBase):
    """``sys.stdout.buffer``: bytes decoded as UTF-8 with replacement into the text stream."""

    def __init__(self, text):
        super().__init__()
        self.text = text

    def writable(self):
        return True

    def write(self, b):
        self.text.write(bytes(b).decode("utf-8", "replace"))
        return len(b)


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _send(fd, obj):
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "replace")
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def _memfile(name):
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create(name)
        except OSError:
            pass
    import tempfile

    return os.dup(tempfile.TemporaryFile().fileno())


def _drain(fd, cap):
    """Read back at most ``cap`` bytes written to fd since the last drain, then empty it.

    Returns ``(text, cut, size)``: ``size`` is every byte written, the ones past ``cap`` included.
    """
    size = os.fstat(fd).st_size
    os.lseek(fd, 0, os.SEEK_SET)
    data = _read_exact(fd, min(size, cap)) or b""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    return data.decode("utf-8", "replace"), size > cap, size


def _descendants(root):
    """Pids whose parent chain leads to ``root`` (one pass over /proc)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                parent[int(name)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def _reap_children(deadline_s=3.0):
    """Kill every process the snippet left behind and wait until they are gone.

    Cheap (one syscall) when there is none. A fork bomb is fought for ``deadline_s`` seconds; the
    host's per-call timeout and container/uid kill are the backstop.
    """
    import time

    end = time.monotonic() + deadline_s
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass  # reap what already exited
        except ChildProcessError:
            return  # no descendant left at all (orphans come back to us: we are a subreaper)
        if time.monotonic() > end:
            return
        for p in _descendants(os.getpid()):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)


def _run(code, cap, namespace, out_fd, err_fd):
    out, err = _Capped(cap), _Capped(cap)
    sys.stdout, sys.stderr = out, err
    status, error = "ok", ""
    import linecache

    linecache.cache["<cell>"] = (len(code), None, code.splitlines(True), "<cell>")
    try:
        exec(compile(code, "<cell>", "exec"), namespace)
    except SystemExit as e:
        if e.code not in (None, 0):
            status, error = "error", f"SystemExit: {e.code}"
    except MemoryError:
        namespace.clear()  # free what the snippet holds: the worker is replaced after this call
        status, error = "oom", "MemoryError: the snippet passed the memory cap"
    except BaseException as e:  # noqa: B902 - the snippet's exception is the result
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        status = "error"
        error = "".join(traceback.format_exception(type(e), e, tb))
    finally:
        if os.getpid() != _WORKER_PID[0]:
            os._exit(0)  # a process the snippet forked came back here: it must never answer
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    _reap_children()
    fd_out, t1, n_out = _drain(out_fd, cap)
    fd_err, t2, n_err = _drain(err_fd, cap)
    stdout, stderr = out.value() + fd_out, err.value() + fd_err
    truncated = out.truncated or err.truncated or t1 or t2 or len(stdout) > cap or len(stderr) > cap
    return {
        "status": status,
        "stdout": stdout.encode("utf-8", "replace")[:cap].decode("utf-8", "ignore"),
        "stderr": stderr.encode("utf-8", "replace")[:cap].decode("utf-8", "ignore"),
        "error": error.encode("utf-8", "replace").decode("utf-8")[-cap:],
        "truncated": truncated,
        "stdout_chars": out.written + n_out,  # what the snippet printed (bytes for what bypassed sys.stdout)
        "stderr_chars": err.written + n_err,
    }


def main(argv):
    """Set up, say hello, then answer one frame per snippet until stdin closes."""
    cfg = json.loads(argv[1]) if len(argv) > 1 else {}
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out_fd, err_fd = _memfile("stdout"), _memfile("stderr")
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in (proto_in, proto_out, out_fd, err_fd):
        os.set_inheritable(fd, False)
    _WORKER_PID[0] = os.getpid()

    def _close_protocol():  # in a child forked by a snippet: it cannot reach the host
        for fd in (proto_in, proto_out):
            try:
                os.close(fd)
            except OSError:
                pass

    os.register_at_fork(after_in_child=_close_protocol)
    sys.stdin = open(os.devnull)
    got = _setup(cfg)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    _send(proto_out, dict(ready=True, pid=os.getpid(), uid=os.getuid(), **got))
    while True:
        header = _read_exact(proto_in, _HEADER.size)
        if header is None:
            return 0
        body = _read_exact(proto_in, _HEADER.unpack(header)[0])
        if body is None:
            return 0
        req = json.loads(body.decode("utf-8"))
        resp = _run(req["code"], int(req.get("cap", 16384)), namespace, out_fd, err_fd)
        _send(proto_out, resp)
        if resp["status"] == "oom":
            return 0  # the host replaces an out-of-memory worker; leave now


if __name__ == "__main__":
    sys.exit(main(sys.argv))
