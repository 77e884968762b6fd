"""The sandbox of agent commands: bubblewrap (`bwrap`, the Linux sandbox of Flatpak and of
Claude Code's own sandboxing), when it is installed and works here. The one module that
builds bubblewrap's command lines: the sandbox, and for a coding CLI with a sandbox of its
own, the bare PID namespace (`in_pid_namespace`) or network namespace (`in_network_namespace`)
it runs in. It also starts a coding CLI tied to the engine (`spawn`: in those namespaces, with
a parent-death signal) and ends all it started (`kill_tree`), for every CLI backend.

A command inside the sandbox sees:
- a PID namespace of its own, so the engine's /proc (and its environment, API keys
  included) is out of sight;
- a network namespace of its own: its own loopback, none of the machine's. No loopback
  service, abstract Unix socket (those are per network namespace), Prefect API or MCP server
  of the engine's side is reachable. With the network on, the one way out is the egress
  proxy's Unix socket, bound in, behind a bridge on the sandbox's loopback
  (`labrun.egress`, `labrun.netbridge`), which reaches only the internet;
- only the scrubbed environment: bwrap itself is started from it, since its first process
  keeps the environment it was started with; a home and caches of the session's own
  (`.labrun/cache/`: pip, uv, Hugging Face and torch write there, kept across attempts and
  resumes);
- no capabilities (as root, bwrap would otherwise keep them, and a remount would undo the
  read-only binds), and a session of its own (no terminal to push keystrokes into);
- the workspace read-write, its `.labrun/` read-only, the rest of the file system read-only,
  except what is hidden (`hidden_paths`): `/run` (the machine's service sockets), every
  user's home whatever its files are named (deny by default: shell start-up files, tokens and
  logins of tools no list knows), the CLIs' and Prefect's homes wherever they lie, and what
  only root may read (password hashes, the machine's private keys, logs, mail). What the
  sandbox needs is laid over the covered homes: the workspace, the session's home, /tmp and
  the Python installation labrun's helpers run on;
- a private /tmp (a folder of the session's, so that it lasts from one command to the next)
  and a private /dev (with the GPUs: an attempt's own alone, `Sandbox.with_gpus`);
and it dies with the engine, however the engine dies.

bwrap's own `--die-with-parent` leaves a window of some milliseconds after bwrap starts (it
sets the signal only once the sandbox is built), in which a killed engine leaves the sandbox
running for good. The lifeline closes it: a watcher inside the sandbox, started before the
command, waits on a pipe that only the engine holds open. The kernel closes that pipe when
the engine dies, and the watcher then kills everything in the sandbox.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import psutil

from labrun.egress import BRIDGE_PORT, PROXY_URL, PROXY_VARIABLES
from labrun.gpus import Claim
from labrun.interrupts import dies_with_labrun
from labrun.settings import settings
from labrun.wsfs import Beneath

log = logging.getLogger("labrun")

HOW_TO_INSTALL = "install bubblewrap (Debian and Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`)"
DEV = Path("/dev")
GPU_DEVICES = ("nvidia*", "dri", "kfd")
"""The GPUs' nodes under /dev: NVIDIA's (one per GPU, /dev/nvidia<minor>, and the driver's
shared ones: nvidiactl, nvidia-uvm, nvidia-caps...), and AMD's and Intel's."""
_BASE = ("--unshare-pid", "--unshare-net", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
         "--ro-bind", "/", "/", "--dev", "/dev")
PID_NAMESPACE = ("--dev-bind", "/", "/", "--unshare-pid", "--die-with-parent")
"""For a coding CLI that confines its own commands: the whole file system as it is and a PID
namespace that ends with the engine. No new /proc: with one mounted here, a sandbox the CLI
makes itself (Claude Code's bubblewrap) cannot mount its own."""
# `kill -1` reaches every process of the sandbox's PID namespace but its init, which then
# exits with its child. The command is not handed the lifeline.
_WATCHER = '{{ read -r -u {fd} _; kill -KILL -1; }} & {before}exec "$@" {fd}<&-'
EGRESS_SOCKET = "/run/labrun/egress.sock"
"""Where the egress proxy's socket is bound inside the sandbox."""
BRIDGE = Path(__file__).with_name("netbridge.py")
"""Run from its text: an installed labrun may lie where the sandbox shows nothing (under /tmp)."""
NO_KEYRINGS = Path(__file__).with_name("no_keyrings.py")
"""Run from its text too: what every command of the sandbox is started through."""
HOMES = ("/root", "/home")
"""Every user's home, covered whole: no list of credential stores, which any tool can outgrow."""
ROOT_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssh/ssh_host_*key",
                 "/etc/ssl/private", "/var/backups", "/var/log", "/var/mail", "/var/spool")
"""Outside the homes, what only root may read (and a command run as root, with no capabilities,
still reads what root owns): password hashes and their backups, the machine's private keys,
its logs and its mail. Nothing a command needs lies there."""
STORE_VARIABLES = ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "GEMINI_CLI_HOME", "PREFECT_HOME", "PREFECT_PROFILES_PATH")
"""Variables naming a CLI's home or Prefect's home or profiles (its database holds every
session's records; its profiles may hold an API key), which may lie outside the homes."""
CACHE_VARIABLES = {"XDG_CACHE_HOME": "", "PIP_CACHE_DIR": "pip", "UV_CACHE_DIR": "uv", "HF_HOME": "huggingface",
                   "TORCH_HOME": "torch"}


def interpreter() -> str:
    """The Python that runs labrun's helpers inside the sandbox (the bridge, the hand-over of
    secrets): the installation's own, not a virtual environment's link or copy, which may lie
    under /tmp; `Sandbox.wrap` shows the installation wherever it lies."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def homes() -> list[Path]:
    """Every user's home (`HOMES`) and this user's wherever it lies: $HOME (`Path.home()`) and
    the account's, which differ when HOME is moved."""
    found = [*HOMES, os.environ.get("HOME", "")]
    try:
        found.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid with no account (a container's)
        pass
    # A home of / (a container's user) is the system itself: it stays read-only, not covered.
    return [Path(h) for h in found if h and Path(h) != Path("/")]


def hidden_paths() -> list[Path]:
    """What the sandbox covers up, where it exists: the homes, the CLIs' and Prefect's homes
    wherever their variables put them, and root's secrets; none inside another."""
    paths = [*homes(), *(Path(os.environ[v]).expanduser() for v in STORE_VARIABLES if os.environ.get(v)),
             *(Path(p) for pattern in ROOT_SECRETS for p in sorted(glob.glob(pattern)))]
    paths = [p for p in dict.fromkeys(paths) if p.exists()]
    return [p for p in paths if not any(q in p.parents for q in paths)]


@dataclass(frozen=True)
class Sandbox:
    workspace: Path
    tmp: Path
    """Bound as /tmp."""
    readonly: tuple[Path, ...] = ()
    """Folders inside the workspace that commands may read but not change."""
    network: bool = True
    writable: tuple[Path, ...] = ()
    """Folders that commands may change besides the workspace, even inside a read-only one
    (a coding CLI's own home, when the CLI itself runs in the sandbox)."""
    cache: Path | None = None
    """The commands' home and caches (HOME, XDG_CACHE_HOME, pip's, uv's, Hugging Face's, torch's)."""
    egress: Path | None = None
    """The egress proxy's Unix socket: with `network`, the one way out."""
    no_proxy: str = "localhost,127.0.0.1,::1"
    """What goes to the sandbox's own loopback, not to the proxy (NO_PROXY)."""
    hidden: tuple[Path, ...] = ()
    """Files and folders covered up besides `hidden_paths()` (a sealed evaluation's, and the
    folder of its scorer's run in `.labrun/`)."""
    shown: tuple[tuple[Path, Path], ...] = ()
    """(file or folder, where) shown read-only at a path of its own (the sealed scorer and its
    data, to the scorer's run alone)."""
    mounted_from: Path | None = None
    """The folder shown at the workspace's path instead of the workspace (a reproduction's
    rebuilt copy: the command sees the paths it saw, and the workspace is out of its reach)."""
    gpu_minors: tuple[int, ...] | None = None
    """The NVIDIA GPUs whose /dev/nvidia<minor> is bound (`with_gpus`); None: every GPU's."""

    def with_gpus(self, claim: Claim) -> Sandbox:
        """This sandbox with only `claim`'s NVIDIA GPUs bound (all of them where their minors
        are unknown; none for a claim of none)."""
        return replace(self, gpu_minors=claim.minors)

    def wrap(self, argv: list[str], lifeline: int) -> list[str]:
        """`argv` run inside the sandbox (which needs `bubblewrap()`). `lifeline` is the read
        end of a pipe whose write end only the engine holds: the sandbox lasts while it is
        open."""
        bwrap = bubblewrap()
        assert bwrap is not None, "Sandbox.wrap needs bubblewrap"
        self.tmp.mkdir(parents=True, exist_ok=True)
        args = [bwrap, *_BASE]
        for device in gpu_nodes(self.gpu_minors):
            args += ["--dev-bind", device, device]
        args += ["--proc", "/proc", "--tmpfs", "/run"]
        # Deny by default: the homes are covered first, and all the sandbox shows is laid over
        # them (bwrap mounts in the order of its arguments): /tmp, the Python installation of
        # labrun's helpers (pyenv's, say, under the home), the workspace (which may lie in a
        # home, or under /tmp itself) and then the session's own home and caches.
        args += cover(hidden_paths())
        args += ["--bind", str(self.tmp), "/tmp", "--ro-bind", sys.base_prefix, sys.base_prefix,
                 "--bind", str(self.mounted_from or self.workspace), str(self.workspace)]
        for path in self.readonly:
            path.mkdir(parents=True, exist_ok=True)
            args += ["--ro-bind", str(path), str(path)]
        for path in (*self.writable, *([self.cache] if self.cache else [])):
            path.mkdir(parents=True, exist_ok=True)
            args += ["--bind", str(path), str(path)]
        # After the workspace, which may hold one of them; the rest of /tmp is not in the sandbox's own.
        args += cover(p for p in self.hidden if Path("/tmp") not in p.parents or self.workspace in p.parents)
        for source, where in self.shown:
            args += ["--ro-bind", str(source), str(where)]
        # Last on the PATH, the Python labrun runs on (shown read-only above): a `python3` where the
        # user's lies in a home the sandbox covers (pyenv's shims), and none other is installed.
        path = os.environ.get("PATH", os.defpath)
        args += ["--setenv", "TMPDIR", "/tmp", "--setenv", "PATH", f"{path}{os.pathsep}{Path(sys.base_prefix, 'bin')}"]
        if self.cache:
            args += ["--setenv", "HOME", str(self.cache / "home")]
            own_folder(self.cache / "home")
            for name, sub in CACHE_VARIABLES.items():
                args += ["--setenv", name, str(self.cache / sub)]
        before = ""
        if self.network and self.egress:
            args += ["--ro-bind", str(self.egress), EGRESS_SOCKET, *proxy_variables(self.no_proxy)]
            before = bridge(EGRESS_SOCKET)
        return [*args, "--chdir", str(self.workspace), "--", *watched(argv, lifeline, before, keyrings=False)]


def gpu_nodes(minors: tuple[int, ...] | None = None) -> list[str]:
    """The GPUs' nodes under /dev (`DEV`) a sandbox binds: with `minors`, of NVIDIA's per-GPU nodes
    (/dev/nvidia<N>) only those; the driver's shared nodes, which every CUDA program opens,
    and the other vendors' (which labrun does not share out) always."""
    nodes = sorted(str(d) for pattern in GPU_DEVICES for d in DEV.glob(pattern))
    if minors is None:
        return nodes
    per_gpu = re.compile(r"nvidia(\d+)")
    return [n for n in nodes if not (m := per_gpu.fullmatch(Path(n).name)) or int(m.group(1)) in minors]


def own_folder(path: Path) -> None:
    """`path` a folder again, whatever a command left in its place (a file, a link: set aside
    beside it, not followed)."""
    files = Beneath(path.parent)
    if not files.is_dir(path.name):
        files.set_aside(path.name, "in-the-way")
        path.mkdir()


def cover(paths: Iterable[Path]) -> list[str]:
    """bwrap's arguments that cover up `paths`: a folder by an empty one, a file by /dev/null
    (which cannot be opened there: bwrap's binds are nodev)."""
    args = []
    for path in paths:
        args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    return args


def proxy_variables(no_proxy: str) -> list[str]:
    """bwrap's arguments that point HTTP(S)_PROXY at the bridge, and NO_PROXY at `no_proxy`."""
    args = []
    for name in PROXY_VARIABLES:
        args += ["--setenv", name, PROXY_URL]
    for name in ("NO_PROXY", "no_proxy"):
        args += ["--setenv", name, no_proxy]
    return args


def bridge(socket_path: str, lifeline: int | None = None) -> str:
    """The shell command (and `&& `) that starts the bridge to the egress proxy's socket and
    returns once it listens (`watched`'s `before`). With `lifeline`, the bridge holds it and
    goes when it closes; without, it does not get it (its PID namespace ends it)."""
    started = shlex.join([interpreter(), "-I", "-c", BRIDGE.read_text(), str(BRIDGE_PORT), socket_path,
                          *([str(lifeline)] if lifeline is not None else [])])
    return f"{started} </dev/null >/dev/null 2>&1 {'' if lifeline is not None else '{fd}<&- '}&& "


def watched(argv: list[str], lifeline: int, before: str = "", keyrings: bool = True) -> list[str]:
    """`argv` with the lifeline's watcher beside it: run in a PID namespace of bubblewrap's,
    everything in it ends when the engine's end of the lifeline closes. `before`: a shell
    command (and `&& `) that must succeed first, such as the network bridge. Without
    `keyrings`, `argv` runs with the kernel's keyrings out of its reach (`no_keyrings`)."""
    script = _WATCHER.format(fd=lifeline, before=before.replace("{fd}", str(lifeline)))
    if not keyrings:
        argv = [interpreter(), "-I", "-c", NO_KEYRINGS.read_text(), *argv]
    return ["bash", "-c", script, "labrun-lifeline", *argv]


def in_pid_namespace(argv: list[str], lifeline: int, guard: Sandbox | None = None) -> list[str]:
    """`argv` in a PID namespace of its own that ends with the lifeline (needs `bubblewrap()`);
    with `guard`, the session's sandbox, the file system as `guarded` keeps it."""
    return [bubblewrap(), *PID_NAMESPACE, *guarded(guard), "--", *watched(argv, lifeline)]


def guarded(sandbox: Sandbox | None) -> list[str]:
    """For a CLI that runs outside the session's sandbox but confines its commands itself:
    bwrap's arguments that keep to the session's sandbox where the CLI's own sandbox does not
    (Claude Code's lets its Bash write anywhere the user can). The file system is read-only
    but for the workspace, the sandbox's /tmp and its writable folders (the CLI's own home);
    the workspace's read-only folders (`.labrun/`, the engine's records) stay read-only, and
    its hidden files (a sealed evaluation's) are covered; what it shows (labrun's MCP socket)
    is bound in at its own path. The homes stay readable, unlike in
    the sandbox (`hidden_paths`): the CLI's own login lies in the user's."""
    if sandbox is None:
        return []
    sandbox.tmp.mkdir(parents=True, exist_ok=True)
    args = ["--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--dev-bind", "/proc", "/proc",
            "--bind", str(sandbox.tmp), "/tmp"]
    inside = [p for p in sandbox.writable if sandbox.workspace in p.parents]
    # Outside the workspace first: one of them may hold it (and the workspace then keeps its own rules).
    for path in [p for p in sandbox.writable if p not in inside] + [sandbox.workspace]:
        if not path.exists():
            path.mkdir(parents=True)
        args += ["--bind", str(path), str(path)]  # a folder, or a file (`~/.claude.json`)
    if sandbox.egress is not None:  # the bridge's way to the proxy, which may lie under /tmp
        args += ["--bind", str(sandbox.egress), str(sandbox.egress)]
    for source, where in sandbox.shown:  # labrun's MCP socket, under the /tmp replaced above
        args += ["--ro-bind", str(source), str(where)]
    for path in sandbox.readonly:
        args += ["--ro-bind", str(path), str(path)]
    for path in inside:
        path.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(path), str(path)]
    return args + cover(sandbox.hidden)


def in_network_namespace(argv: list[str], lifeline: int, egress: Path, guard: Sandbox | None = None) -> list[str]:
    """`argv` in a network namespace of its own whose one way out is the egress proxy at
    `egress`, the file system as `guarded` keeps it for `guard`: for a CLI that confines its commands itself but would
    give them the machine's loopback (Codex, whose sandbox does not nest in a PID namespace of
    bubblewrap's: its own bubblewrap's children go to that namespace's init and it waits
    for good). No NO_PROXY, so that its calls to the endpoints the engine named on the
    loopback (its API) go through the proxy too. With no PID namespace
    to end it, the bridge goes when the lifeline closes; the CLI has its parent-death signal.
    `guard`: as for `in_pid_namespace`."""
    return [bubblewrap(), "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", *guarded(guard),
            *proxy_variables(""), "--",
            "bash", "-c", f'{bridge(str(egress), lifeline)}exec "$@" {lifeline}<&-', "labrun-netns", *argv]


_HAND_OVER = ("import json, os, sys; fd = int(sys.argv[1]); env = {**os.environ, **json.load(os.fdopen(fd))}; "
              "os.execve(sys.argv[2], sys.argv[2:], env)")


class Secrets:
    """Variables for the sandbox's last program only (a CLI's key): kept
    out of bwrap's environment and the watcher's, which a process of the same user inside
    could read, and handed over through a pipe that a loader reads and closes before it
    execs the program with them. The program must keep its own environment unreadable
    (labrun.agents.gemini.sealed)."""

    def __init__(self, env: dict[str, str]):
        self.fd, held = os.pipe()
        os.write(held, json.dumps(env).encode())  # far below a pipe's buffer
        os.close(held)

    def handed_to(self, argv: list[str]) -> list[str]:
        return [interpreter(), "-I", "-c", _HAND_OVER, str(self.fd), *argv]

    def close(self) -> None:
        os.close(self.fd)  # the process holds its own copy


class Lifeline:
    """The pipe a bubblewrap lives on: the process gets the read end (`fd`), the engine only
    the write end, which `cut` closes once the process has ended (the kernel does it when the
    engine dies)."""

    def __init__(self) -> None:
        self.fd, self._held = os.pipe()

    def popen(self, argv: list[str], keep: tuple[int, ...] = (), **kwargs) -> subprocess.Popen:
        """`keep`: other descriptors the process gets (a `Secrets` pipe)."""
        try:
            return subprocess.Popen(argv, pass_fds=(self.fd, *keep), **kwargs)
        except BaseException:
            self.cut()
            raise
        finally:
            os.close(self.fd)  # the process holds its own copy

    def cut(self) -> None:
        os.close(self._held)


def bubblewrap() -> str | None:
    """The path of a working `bwrap` on PATH, or None; says once, when there is none, that
    agent commands run unsandboxed and how to change that."""
    return probed_bubblewrap(shutil.which("bwrap"))


@lru_cache(maxsize=4)  # per `bwrap` found: a PATH changed since the last probe is looked up anew
def probed_bubblewrap(path: str | None) -> str | None:
    if path is None:
        log.warning("agent commands run unsandboxed: bubblewrap (bwrap) is not installed; %s", HOW_TO_INSTALL)
        return None
    probe = subprocess.run([path, *_BASE, "--proc", "/proc", "true"], env={}, capture_output=True, text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
        log.warning("agent commands run unsandboxed: bubblewrap cannot make a sandbox here (%s); "
                    "it needs root or unprivileged user namespaces", why)
        return None
    return path


# -- a coding CLI's process, tied to the engine ------------------------------------------------

def pid_namespaces() -> bool:
    """Whether a CLI run gets a PID namespace of its own (bubblewrap; LABRUN_CLI_PIDNS=off: never)."""
    return settings().cli_pidns and bubblewrap() is not None


def spawn(argv: list[str], cwd: Path, env: dict[str, str], stderr, namespace: bool = False,
          lifeline: Lifeline | None = None, keep: tuple[int, ...] = (), egress: Path | None = None,
          guard: Sandbox | None = None) -> subprocess.Popen:
    """Start a CLI run tied to the engine: with a parent-death signal, and when asked for
    (`pid_namespaces()`) in a PID namespace that ends with the lifeline (`watched`).
    It stays in the engine's process group, so a kill of that group reaches it too.
    `argv` may be a sandbox on the same lifeline; `keep`, descriptors it gets besides; with
    `egress`, in a network namespace whose one way out is that proxy (`in_network_namespace`);
    either keeps what `guard`, the session's sandbox, keeps (`guarded`)."""
    if namespace:
        assert lifeline is not None, "a PID namespace needs its lifeline"
        argv = in_pid_namespace(argv, lifeline.fd, guard)
    elif egress is not None:
        assert lifeline is not None, "the network namespace's bridge needs its lifeline"
        argv = in_network_namespace(argv, lifeline.fd, egress, guard)
    if lifeline:
        return lifeline.popen(argv, keep, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=stderr, preexec_fn=dies_with_labrun())
    return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            pass_fds=keep, preexec_fn=dies_with_labrun())


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process and everything under it (in a PID namespace, its end ends all)."""
    try:
        parent = psutil.Process(proc.pid)
        family = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
