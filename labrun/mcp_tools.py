"""The engine's tools over MCP, for a coding CLI that brings its own shell and editor.

`ToolServer` serves the `ToolBox` tools other than its shell and editor (`ENGINE_TOOLS`) to
exactly one MCP client per CLI run, with no listener anything else can reach and no token. The CLI starts labrun's relay (`labrun/mcp_relay.py`, run from its text)
as a stdio MCP server (`relay`); the relay connects to a Unix socket in a folder of the
engine's under /tmp, which the sandbox and the namespaces a CLI runs in replace with their
own (the CLI's namespace gets the socket bound in, `socket` on the machine); the engine
accepts that first connection and at once closes and removes the listener (`listening`). A
CLI starts its MCP servers before the model's first turn, so the relay is first; whatever
connects later (a command of the CLI's shell, an experiment, another session's agent) finds
no one listening. The MCP session then runs over that one connection, in a thread of its own.

The tools do not run in that thread. Each call waits in `inbox` until the engine's own
thread, the phase task's, takes it and runs it with `run_call`: so calls run one at a time,
an experiment attempt stays a Prefect subtask of the phase, and STATE.md keeps a single
writer.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
import socket
import tempfile
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

from labrun.sandbox import interpreter
from labrun.tools import ToolBox, ToolResult, tool_specs

ENGINE_TOOLS = ("run_experiment", "experiment_output", "stop_experiment", "complete_phase")
log = logging.getLogger("labrun")


@dataclass
class ToolCall:
    """One call from the client, answered through `future` by the engine's thread."""

    name: str
    arguments: dict[str, Any]
    future: Future = field(default_factory=Future)


def run_call(toolbox: ToolBox, call: ToolCall,
             before: Callable[[ToolCall], None] = lambda c: None,
             after: Callable[[ToolCall, ToolResult], None] = lambda c, r: None) -> None:
    """Run one call in this thread (`before` and `after` journal it). A call whose client
    gave up before it started is not run."""
    if not call.future.set_running_or_notify_cancel():
        return
    try:
        before(call)
        result = toolbox.call(call.name, call.arguments)
        after(call, result)
    except BaseException as e:  # the client gets an error; the engine sees the exception
        # A signal's interruption is the engine's to unwind, not the MCP thread's: there it
        # would escape the server's task groups and print their traceback on the terminal.
        call.future.set_exception(e if isinstance(e, Exception) else RuntimeError(f"the engine stopped: {e}"))
        raise
    call.future.set_result(result)


RELAY = Path(__file__).with_name("mcp_relay.py")
"""Run from its text: the CLI may run where labrun's package is not visible (the sandbox)."""


def relay(socket_path: str | Path) -> list[str]:
    """The command a CLI runs as labrun's stdio MCP server, reaching the engine at
    `socket_path` (as the CLI sees it)."""
    return [interpreter(), "-I", "-c", RELAY.read_text(), str(socket_path)]


class ToolServer:
    """`with ToolServer(inbox) as server:` for a phase; `with server.listening():` around each
    CLI run, whose MCP server is `relay(server.socket)` (or the socket where it is bound in)."""

    def __init__(self, inbox: "queue.Queue[Any]", names: tuple[str, ...] = ENGINE_TOOLS,
                 server_name: str = "labrun"):
        self.inbox = inbox
        self.server_name = server_name
        self.tools = [
            types.Tool(name=s["name"], description=s["description"], input_schema=s["input_schema"])
            for s in tool_specs() if s["name"] in names
        ]
        self.folder: Path | None = None

    @property
    def socket(self) -> Path:
        """Where each run's listener is, on the engine's side (the same path every run)."""
        assert self.folder is not None, "a ToolServer serves inside its `with` block"
        return self.folder / "mcp.sock"

    def mcp_config(self) -> dict[str, Any]:
        """The `--mcp-config` document (the `mcpServers` shape that MCP clients share): the relay
        to `socket`. No secret in it."""
        argv = relay(self.socket)
        return {"mcpServers": {self.server_name: {"type": "stdio", "command": argv[0], "args": argv[1:]}}}

    def __enter__(self) -> "ToolServer":
        # /tmp, whatever TMPDIR says: the sandbox and a CLI's namespaces all replace it, so no
        # other session's agent sees the folder; 0700, a short path (a socket's is at most 107 bytes).
        self.folder = Path(tempfile.mkdtemp(prefix="labrun-mcp-", dir="/tmp"))
        return self

    def __exit__(self, *exc) -> None:
        # Calls still waiting get an error, so that no client hangs on a stopped engine.
        while True:
            try:
                kind, item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "tool" and item.future.set_running_or_notify_cancel():
                item.future.set_result(ToolResult("The phase stopped before this call ran.", is_error=True))
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- one run's connection ------------------------------------------------------------------

    @contextmanager
    def listening(self) -> Iterator[None]:
        """While the block runs (one CLI run), the socket takes its first connection, and only
        that one: the listener is closed and removed as soon as it is accepted. The session
        on it ends with the block (the relay then ends, and the CLI sees its server gone)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.unlink(missing_ok=True)
        listener.bind(str(self.socket))
        listener.listen(1)
        listener.settimeout(0.1)  # so that the block's end stops the wait
        done = threading.Event()
        taken: list[socket.socket] = []

        def serve() -> None:
            try:
                while not done.is_set():
                    try:
                        conn, _ = listener.accept()
                    except TimeoutError:
                        continue
                    conn.settimeout(None)
                    taken.append(conn)
                    break
            finally:
                listener.close()
                self.socket.unlink(missing_ok=True)
            if taken and not done.is_set():
                self._speak(taken[0])

        thread = threading.Thread(target=serve, name="labrun-mcp", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            for conn in taken:
                try:
                    conn.shutdown(socket.SHUT_RDWR)  # its reader sees the end
                except OSError:
                    pass
            thread.join(10)
            for conn in taken:
                conn.close()

    def _speak(self, conn: socket.socket) -> None:
        """MCP over `conn` until either end closes it: the stdio transport, on the socket's streams."""
        server = Server(self.server_name, on_list_tools=self._list_tools, on_call_tool=self._call_tool)

        async def session() -> None:
            reader = anyio.wrap_file(conn.makefile("r", encoding="utf-8", errors="replace", newline="\n"))
            writer = anyio.wrap_file(conn.makefile("w", encoding="utf-8", newline="\n"))
            async with stdio_server(reader, writer) as (read, write):
                await server.run(read, write, server.create_initialization_options())

        try:
            anyio.run(session)
        except Exception as e:  # the client went away mid-message: its session is over
            log.debug("labrun's MCP session ended: %s", e)

    async def _list_tools(self, ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def _call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        call = ToolCall(params.name, dict(params.arguments or {}))
        self.inbox.put(("tool", call))
        try:
            result: ToolResult = await asyncio.wrap_future(call.future)
        except Exception as e:
            result = ToolResult(f"The engine could not run {params.name}: {e}", is_error=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=result.content)],
                                    is_error=result.is_error)
