"""Prefect and labrun's engine, imported once and kept for later runs (LABRUN_KEEP_API).

Importing Prefect, labrun's flows and the agents' SDKs takes a run about 2.5 s: most of a
warm start. So a run that keeps its API also starts this process, at a low priority once
its own API answers. It imports the engine and waits on a Unix socket. A later `labrun
run`, `resume`, `demo` or `rerun` with the same PREFECT_HOME, Python and labrun hands it its
command line, environment, working directory and terminal (descriptors 0-2); the engine
forks, and the fork runs that command as the run's own process would have. The process the
user started stays the one they see:
- it passes SIGINT and SIGTERM on to the fork, stops and goes on with it (Ctrl-Z, `fg`),
  and exits with the fork's status;
- when it dies (`kill -9`, a closed terminal), the fork kills itself at once, the same as
  a `kill -9` of an engine running in that process.

Only this process's imports are shared: each fork reads its settings, its logging and
everything else from the run's own environment. A module the engine imported that changed
on disk (an upgrade, an edit) retires it: that run starts in its own process.

It shares the kept API's lease and lifetime (`kept_api`): it exits once no run has held the
lease for LABRUN_KEEP_API minutes, and an interrupted run takes it along unless another run
holds the lease. It keeps
none of the secrets of the run that started it. Its address is an abstract socket named
from its key, and each side checks that the other runs as the same user.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import socket
import struct
import sys

from labrun.serving import ServerError, kept_api, prefect_home

COMMANDS = ("run", "resume", "demo", "rerun")
"""The commands that run a session: the ones worth handing over."""
REQUEST_TIMEOUT_S = 5.0
STARTING_TIMEOUT_S = 60.0
"""How long a run waits for an engine that is still importing before it starts on its own."""

READ_AT_IMPORT = ("LABRUN_RETRY_BASE_S", "LABRUN_MIN_FREE_MB", "LABRUN_HASH_MAX_MB")
"""Variables labrun's modules read once, on import (a Prefect task's retry delays among
them): an engine serves only runs whose values match its own."""

in_engine = False
"""True in a run that the kept engine forked."""


def address() -> bytes:
    """The engine's abstract socket: one per user, PREFECT_HOME, Python, labrun and the
    values of READ_AT_IMPORT."""
    import labrun

    key = json.dumps([os.getuid(), str(prefect_home().resolve()), sys.executable, labrun.__file__, sys.path[1:],
                      [os.environ.get(name) for name in READ_AT_IMPORT]])
    return b"\0labrun-engine-" + hashlib.sha256(key.encode()).hexdigest()[:24].encode()


def _same_user(sock: socket.socket) -> int | None:
    """The peer's pid, if it runs as this user."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid if uid == os.getuid() else None


def _connect() -> tuple[socket.socket, int] | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address())
        pid = _same_user(sock)
        if pid is not None:
            return sock, pid
    except OSError:
        pass
    sock.close()
    return None


# --- the run's side ---------------------------------------------------------------------

def hand_over(argv: list[str]) -> int | None:
    """Run `labrun argv` in the kept engine and return its exit status; None when there is
    no engine to take it (then the command runs in this process)."""
    if in_engine or not argv or argv[0] not in COMMANDS or not _keeping():
        return None
    found = _connect()
    if found is None:
        return None
    sock, _ = found
    with sock:
        request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
                              "umask": _umask()}).encode()
        try:
            socket.send_fds(sock, [struct.pack("!I", len(request))], [0, 1, 2])
            sock.sendall(request)
            sock.settimeout(STARTING_TIMEOUT_S)
            reader = sock.makefile("rb")
            first = reader.readline().split()  # the fork's pid, once the engine has forked
        except OSError:
            return None
        except KeyboardInterrupt:  # before the run began: a fork that comes now finds nobody and ends
            os.write(2, b"labrun: interrupted\n")
            return 130
        if len(first) != 2 or first[0] != b"pid":
            return None  # the engine is retiring (`stale`), or went
        run, passed = int(first[1]), []
        sock.settimeout(None)

        def pass_on(signum, frame):
            passed.append(signum)
            try:
                os.kill(run, signum)
            except ProcessLookupError:
                pass

        def suspend(signum, frame):  # Ctrl-Z: the run stops with this process, and goes on with it
            try:
                os.killpg(run, signal.SIGSTOP)  # its group is orphaned (the engine's session): SIGTSTP would not stop it
                os.kill(os.getpid(), signal.SIGSTOP)
                os.killpg(run, signal.SIGCONT)  # `fg` or `bg` continued this process
            except ProcessLookupError:
                pass

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, pass_on)
        signal.signal(signal.SIGTSTP, suspend)
        try:
            what, _, value = reader.readline().partition(b" ")
        except OSError:
            what = b""
        if what == b"exit":
            return int(value)
        if what == b"signal":
            return 128 + int(value)
        if passed:  # a second signal ends the run at once, and may take the engine along
            return 128 + passed[-1]
        os.write(2, b"labrun: the kept engine ended this run without a status\n")
        return 1


def _keeping() -> bool:
    try:
        return kept_api.idle_minutes() > 0
    except ServerError:
        return False  # the run itself says what is wrong with LABRUN_KEEP_API


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def keep() -> None:
    """For a run that keeps its API: start the kept engine if none answers."""
    if in_engine or not _keeping():
        return
    found = _connect()
    if found is not None:
        found[0].close()
        return
    from labrun.serving.processes import spawn

    spawn([sys.executable, "-m", "labrun.serving.kept_engine", str(kept_api.idle_minutes())], kept_api.kept_env(),
          prefect_home() / "labrun" / "kept-engine.log", die_with_parent=False, nice=19)


# --- the engine's side ------------------------------------------------------------------

def serve(idle_s: float) -> None:
    import selectors
    import time

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address())  # before the imports: a run that comes meanwhile waits for them
    except OSError:
        return  # another engine has this address
    listener.listen(16)
    kept_api.write_record("kept-engine")
    lease = kept_api.open_lease()
    if kept_api.unused(lease):  # the run that started it is gone already (interrupted before this record)
        kept_api.forget_record("kept-engine")
        return
    kept_api.release(lease)
    _import_engine()
    # What the forks share stays shared: their collector neither walks it nor, by touching
    # its objects, copies its pages.
    gc.freeze()
    stamps = _module_stamps()
    print(f"kept engine {os.getpid()}: ready, for {idle_s / 60:g} minutes unused", flush=True)
    runs: dict[int, tuple[int, socket.socket]] = {}  # pidfd: (pid, the run's connection)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    idle_since, retiring = time.monotonic(), False
    while True:
        for key, _ in selector.select(timeout=min(idle_s / 4, 1.0)):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                if _module_stamps() != stamps:
                    retiring = True
                    with conn:
                        conn.sendall(b"stale\n")
                    continue
                forked = _fork_run(conn, [listener, lease, *runs, *(c for _, c in runs.values())], selector)
                if forked is not None:
                    runs[forked[0]] = (forked[1], conn)
                    selector.register(forked[0], selectors.EVENT_READ)
            else:
                pid, conn = runs.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with conn:  # a run that returns said its status already; this is for the others
                    try:
                        conn.sendall(b"signal %d\n" % os.WTERMSIG(status) if os.WIFSIGNALED(status)
                                     else b"exit %d\n" % os.waitstatus_to_exitcode(status))
                    except OSError:
                        pass
        if retiring and listener.fileno() >= 0:
            selector.unregister(listener)
            listener.close()  # frees the address for a new engine
            kept_api.forget_record("kept-engine")
        if runs or not kept_api.unused(lease):
            idle_since = time.monotonic()
            continue
        if retiring or time.monotonic() - idle_since >= idle_s:
            kept_api.forget_record("kept-engine")
            return
        kept_api.release(lease)


PREFECT_AT_RUN = ("fastapi.encoders", "prefect.engine", "prefect.flow_engine", "prefect.task_engine",
                  "prefect.artifacts", "prefect.telemetry.run_telemetry", "anyio._backends._asyncio")
"""What Prefect imports only once a flow runs (FastAPI's encoders serialise its parameters)."""
ENGINE_MODULES = (
    "labrun.flows.session", "labrun.turns", "labrun.serving.api", "labrun.interrupts", "labrun.model_api_limit",
    "labrun.agents.anthropic", "labrun.agents.claude_code", "labrun.agents.codex", "labrun.agents.gemini",
    "labrun.agents.scripted", *PREFECT_AT_RUN,
)
"""What a run imports before its first phase: Prefect, the flows, the agents and their SDKs.
Not labrun.cli: its consoles look at the terminal they are made on, which is each run's own."""


def _import_engine() -> None:
    import importlib
    import threading

    for name in ENGINE_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:  # another Prefect's layout: the fork imports what it needs
            if name.startswith("labrun"):
                raise
    assert threading.active_count() == 1, "a thread before fork(): the forks would inherit its locks"


def _module_stamps() -> dict[str, int]:
    stamps = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            try:
                stamps[path] = os.stat(path).st_mtime_ns
            except OSError:
                stamps[path] = 0
    return stamps


def _fork_run(conn: socket.socket, inherited: list, selector) -> tuple[int, int] | None:
    """The pidfd and pid of the fork that runs the request on `conn`; None for a request
    that is not one. The fork closes the engine's `inherited` sockets and descriptors."""
    try:
        conn.settimeout(REQUEST_TIMEOUT_S)
        if _same_user(conn) is None:
            raise OSError("another user")
        head, fds, _, _ = socket.recv_fds(conn, 4, 3)
        body = b""
        size = struct.unpack("!I", head)[0]
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise OSError("cut short")
            body += chunk
        request = json.loads(body)
        conn.settimeout(None)
    except (OSError, ValueError, struct.error):
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        try:
            selector.close()
            for thing in inherited:
                thing.close() if isinstance(thing, socket.socket) else os.close(thing)
            _run(conn, request, fds)
        finally:
            os._exit(1)
    for fd in fds:
        os.close(fd)
    return os.pidfd_open(pid), pid


def _run(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the fork: become the run's process, run its command, report its status."""
    import atexit
    import io
    import threading
    import traceback

    global in_engine
    in_engine = True
    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["labrun", *request["argv"]]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    encoding = os.environ.get("PYTHONIOENCODING", "").split(":")[0] or sys.stdout.encoding
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=encoding)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=encoding,
                                  line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=encoding,
                                  errors="backslashreplace", line_buffering=True)
    def watch() -> None:  # the run's own process went: so does this one, as after a kill -9
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    try:
        conn.sendall(b"pid %d\n" % os.getpid())
    except OSError:
        return  # it left before this began
    threading.Thread(target=watch, daemon=True).start()
    from labrun.cli import main

    try:
        code = main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    try:
        conn.sendall(b"exit %d\n" % code)
    except OSError:
        pass
    os._exit(code)


if __name__ == "__main__":
    from labrun.serving import kept_engine  # this module under its own name, whose `in_engine` a fork sets

    kept_engine.serve(float(sys.argv[1]) * 60)
