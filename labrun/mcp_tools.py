"""The engine's tools over MCP, for a coding CLI that brings its own shell and editor.

`ToolServer` serves some of the `ToolBox` tools (by default `run_experiment` and
`complete_phase`) to any MCP client, over streamable HTTP on 127.0.0.1: a random port, a
random bearer token, one background thread. The tools do not run in that thread. Each call
waits in `inbox` until the engine's own thread, the phase task's, takes it and runs it with
`run_call`: so calls run one at a time, an experiment attempt stays a Prefect subtask of
the phase, and STATE.md keeps a single writer.
"""

from __future__ import annotations

import asyncio
import hmac
import queue
import secrets
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import mcp_types as types
import uvicorn
from mcp.server import Server

from labrun.tools import ToolBox, ToolResult, tool_specs

ENGINE_TOOLS = ("run_experiment", "complete_phase")


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
        call.future.set_exception(e)
        raise
    call.future.set_result(result)


class ToolServer:
    """`with ToolServer(inbox) as server:` serves the tools while the block runs;
    `server.mcp_config()` is what a client needs to connect."""

    def __init__(self, inbox: "queue.Queue[Any]", names: tuple[str, ...] = ENGINE_TOOLS,
                 server_name: str = "labrun"):
        self.inbox = inbox
        self.server_name = server_name
        self.token = secrets.token_urlsafe(32)
        self.tools = [
            types.Tool(name=s["name"], description=s["description"], input_schema=s["input_schema"])
            for s in tool_specs() if s["name"] in names
        ]
        self.port = 0
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def mcp_config(self) -> dict[str, Any]:
        """The `--mcp-config` document (the `mcpServers` shape that MCP clients share)."""
        return {"mcpServers": {self.server_name: {
            "type": "http", "url": self.url,
            "headers": {"Authorization": f"Bearer {self.token}"},
        }}}

    # -- serving ---------------------------------------------------------------------------

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

    def _app(self):
        server = Server(self.server_name, on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        app = server.streamable_http_app()
        expected = f"Bearer {self.token}".encode()

        async def guarded(scope, receive, send):
            if scope["type"] == "http":
                given = dict(scope.get("headers") or []).get(b"authorization", b"")
                if not hmac.compare_digest(given, expected):
                    await send({"type": "http.response.start", "status": 401,
                                "headers": [(b"content-type", b"text/plain")]})
                    await send({"type": "http.response.body", "body": b"labrun: wrong or missing bearer token\n"})
                    return
            await app(scope, receive, send)

        return guarded

    def __enter__(self) -> "ToolServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        # log_config=None: uvicorn's own logging setup (dictConfig) would close every
        # logging handler of this process, Prefect's among them.
        config = uvicorn.Config(self._app(), log_config=None, log_level="warning", lifespan="on",
                                access_log=False)
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [sock]},
                                        name="labrun-mcp", daemon=True)
        self._thread.start()
        give_up = time.monotonic() + 30
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > give_up:
                self.__exit__()
                raise RuntimeError("labrun's MCP server did not start on 127.0.0.1")
            self._thread.join(0.01)
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
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
