"""Running the real Codex and Gemini CLIs in tests, as docs/agent-clis.md says a backend does,
finding the three real CLIs, and a labrun session's setup with one of them (`CliSession`).

`.ci/install-agent-clis` puts Claude Code, Codex and Gemini CLI under `.agent-clis/` (or
`$LABRUN_AGENT_CLIS`); `LABRUN_TEST_CLAUDE` may name another `claude`. Each run
gets: the tests' scripted API in the CLI's own protocol, a home of its own in the test's
temporary directory (never the user's), a scrubbed environment, and labrun's `ToolServer`
as its MCP server (its stdio relay, listening for the one run), with `EngineTools` playing
the engine's thread: it answers every call (recording it) instead of running it through a
`ToolBox`.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from auto_responder import IDEA
from support import labrun

from labrun.mcp_tools import ToolServer, relay
from labrun.tools import ToolResult

REPO = Path(__file__).resolve().parents[1]
PREFIX = Path(os.environ.get("LABRUN_AGENT_CLIS") or REPO / ".agent-clis")
INSTALL = "install them with `.ci/install-agent-clis`"
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC"}


class CliSession:
    """A labrun session with a real coding CLI: the fake API (`.api`), the idea, the workspace,
    and the environment of `labrun`, without the user's variables of that CLI (`drop`), with
    HOME in the test's folder and labrun's back-off starting at 0.2 s, so storms stay short."""

    agent = model = ""
    drop: tuple[str, ...] = ()

    def __init__(self, tmp_path: Path, forker, api, env: dict[str, str]):
        self.forker = forker
        self.api = api.start()
        (tmp_path / "home").mkdir()
        self.idea = tmp_path / "idea.yaml"
        self.idea.write_text(IDEA)
        self.ws = tmp_path / "ws"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(self.drop)}
        self.env.update({"HOME": str(tmp_path / "home"), "LABRUN_RETRY_BASE_S": "0.2",
                         "LABRUN_MIN_WINDOW_WAIT_S": "0", "LABRUN_PHASE_TIMEOUT_S": "",
                         "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **env})

    def run_args(self, *args: str) -> list[str]:
        return ["run", str(self.idea), "--workspace", str(self.ws), "--agent", self.agent, "--model", self.model,
                *args]

    def run(self, *args: str):
        return self.forker.run(self.run_args(*args), env=self.env, whole_env=True)

    def start(self):
        """The engine in a process group of its own, to kill."""
        return self.forker.start(self.run_args(), env=self.env, new_session=True, whole_env=True)

    def status(self) -> dict:
        done = labrun("status", str(self.ws), "--json", env=self.env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def posts(self, since: float = 0.0) -> list[dict]:
        return [r for r in self.api.requests if r["method"] == "POST" and r["time"] >= since]


def launcher(name: str, product: str):
    """The npm launcher `name` under the CLIs' prefix, and the mark that skips a test without it."""
    path = PREFIX / "node_modules/.bin" / name
    return path, pytest.mark.skipif(not path.exists(), reason=f"the real {product} is not installed: {INSTALL} "
                                    "(npm), or point LABRUN_AGENT_CLIS at their prefix")


def claude_executable() -> str | None:
    found = os.environ.get("LABRUN_TEST_CLAUDE") or str(PREFIX / "node_modules/.bin/claude")
    return found if Path(found).is_file() and os.access(found, os.X_OK) else None


def codex_binary() -> Path | None:
    """Codex's native binary, not the npm launcher: on node < 22 the launcher stays the parent
    and a SIGKILL of it leaves the native process running."""
    found = sorted(PREFIX.glob("node_modules/@openai/codex*/**/vendor/*/bin/codex"))
    return found[0] if found else None


def gemini_binary() -> Path | None:
    path = PREFIX / "node_modules/.bin/gemini"
    return path if path.exists() else None


@dataclass
class EngineTools:
    """labrun's MCP tool server, listening for one CLI run, each call answered `ok: <name>`
    from this side."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __enter__(self) -> "EngineTools":
        self._inbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.server = ToolServer(self._inbox).__enter__()
        self._listening = self.server.listening()
        self._listening.__enter__()
        self._thread = threading.Thread(target=self._answer, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listening.__exit__(None, None, None)
        self.server.__exit__()

    def _answer(self) -> None:
        while not self._stop.is_set():
            try:
                _, call = self._inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            self.calls.append((call.name, call.arguments))
            if call.future.set_running_or_notify_cancel():
                call.future.set_result(ToolResult(f"ok: {call.name}"))


@dataclass
class Run:
    events: list[dict[str, Any]]
    returncode: int
    stderr: str

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    def items(self, kind: str) -> list[dict[str, Any]]:
        return [e["item"] for e in self.of_type("item.completed") if e["item"].get("type") == kind]


def run_cli(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> Run:
    p = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    return Run(events, p.returncode, p.stderr)


# -- Codex ---------------------------------------------------------------------------------


def codex_argv(api_url: str, tools: EngineTools | None = None, *, resume: str | None = None,
               model: str | None = None, prompt: str = "go") -> list[str]:
    """`codex exec --json` against the scripted API, confined to the workspace."""
    argv = [str(codex_binary()), "exec", "--json", "--skip-git-repo-check", "--ignore-user-config", "--ignore-rules"]
    if resume:
        argv += ["resume", resume]
    config = {
        "openai_base_url": f"{api_url}/v1",
        "sandbox_mode": "workspace-write",  # `exec resume` has no --sandbox flag; -c works for both
        "sandbox_workspace_write.network_access": True,
        "sandbox_workspace_write.exclude_slash_tmp": True,
        "sandbox_workspace_write.exclude_tmpdir_env_var": True,
        "shell_environment_policy.inherit": "core",  # the agent's commands get no secrets
        "analytics.enabled": False,  # no side traffic
        "check_for_update_on_startup": False,
    }
    if tools is not None:
        command, *args = relay(tools.server.socket)
        config.update({
            "mcp_servers.labrun.command": command,
            "mcp_servers.labrun.args": args,
            "mcp_servers.labrun.default_tools_approval_mode": "approve",  # exec never asks; unapproved calls fail
        })
    for key, value in config.items():
        argv += ["-c", f"{key}={json.dumps(value)}"]
    if model:
        argv += ["-m", model]
    return argv + [prompt]


def codex_env(tmp: Path) -> dict[str, str]:
    """CODEX_HOME must not lie under TMPDIR: Codex refuses to create its sandbox helper
    (`codex-linux-sandbox`, an alias of itself) in a temporary directory."""
    env = {**BASE_ENV, "HOME": str(tmp / "home"), "CODEX_HOME": str(tmp / "codex-home"),
           "TMPDIR": str(tmp / "tmp"), "CODEX_API_KEY": "sk-test-labrun"}
    for d in ("home", "codex-home", "tmp"):
        (tmp / d).mkdir(exist_ok=True)
    return env


# -- Gemini CLI ----------------------------------------------------------------------------


def gemini_argv(prompt: str = "go", *, resume: str | None = None, model: str = "gemini-2.5-pro") -> list[str]:
    """Non-interactive, stream-JSON; `-m` set so that no model-router call comes first."""
    argv = [str(gemini_binary()), "--output-format", "stream-json", "--skip-trust", "--approval-mode", "yolo",
            "-m", model]
    if resume:
        argv += ["--resume", resume]
    return argv + ["-p", prompt]


def gemini_env(tmp: Path, api_url: str, tools: EngineTools | None = None) -> dict[str, str]:
    """A settings home of its own (GEMINI_CLI_HOME/.gemini/settings.json): API-key auth,
    environment redaction for its shell, no self-update and no usage statistics (side
    traffic), labrun's MCP server (its relay)."""
    home = tmp / "gemini-home"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {"security": {"auth": {"selectedType": "gemini-api-key"},
                                             "environmentVariableRedaction": {"enabled": True}},
                                "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
                                "privacy": {"usageStatisticsEnabled": False}}
    env = {**BASE_ENV, "HOME": str(home), "GEMINI_CLI_HOME": str(home), "GEMINI_API_KEY": "gemini-test-labrun",
           "GOOGLE_GEMINI_BASE_URL": api_url, "GEMINI_CLI_NO_RELAUNCH": "true", "TMPDIR": str(tmp / "tmp")}
    (tmp / "tmp").mkdir(exist_ok=True)
    if tools is not None:
        command, *args = relay(tools.server.socket)
        settings["mcpServers"] = {"labrun": {"command": command, "args": args, "trust": True}}
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings, indent=2))
    return env


def bwrap_argv(workspace: Path, writable: list[Path]) -> list[str]:
    """Gemini CLI confines nothing on Linux without docker or podman: bubblewrap does. The
    filesystem read-only but for the workspace and the CLI's home, a private /tmp, its own
    PID namespace (when bwrap dies, every process in it does), the network shared (the API
    and labrun's MCP server)."""
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--unshare-pid", "--new-session",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for path in [workspace, *writable]:
        argv += ["--bind", str(path), str(path)]
    return argv + ["--chdir", str(workspace)]
