"""labrun's tools over MCP (`labrun.mcp_tools`): one connection per CLI run, its relay's, and
no token. Each attack is shown working while the engine's socket still listens (the
protection not yet in force: nothing has connected), then refused once the relay has."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

sys.path.insert(0, str(Path(__file__).parent))
from claude_responder import MCP_PROBE  # noqa: E402

from labrun.mcp_tools import ToolServer, relay  # noqa: E402
from labrun.tools import ToolResult  # noqa: E402


@pytest.fixture
def server():
    """A ToolServer whose calls the engine's thread (here a stub) answers `ok: <name>`."""
    inbox: queue.Queue = queue.Queue()
    calls: list[str] = []
    stop = threading.Event()

    def engine() -> None:
        while not stop.is_set():
            try:
                _, call = inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            if call.future.set_running_or_notify_cancel():
                calls.append(call.arguments.get("summary", call.name))
                call.future.set_result(ToolResult(f"ok: {call.name}"))

    thread = threading.Thread(target=engine, daemon=True)
    thread.start()
    with ToolServer(inbox) as s:
        s.calls = calls
        yield s
    stop.set()
    thread.join()


def probe(cwd: Path, socket_path: Path) -> str:
    """The hostile agent's command (`claude_responder.MCP_PROBE`), run as a process of its own,
    at this server's socket alone (not at other sessions' on this machine)."""
    done = subprocess.run([sys.executable, "-c", MCP_PROBE, str(socket_path)], cwd=cwd, capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


async def as_the_cli(server: ToolServer, while_connected=None) -> list[str]:
    """What a CLI does: start the relay as its stdio MCP server, list the tools, call one;
    `while_connected()` runs (in a thread) while the relay's session is open."""
    argv = relay(server.socket)
    async with Client(stdio_client(StdioServerParameters(command=argv[0], args=argv[1:])), mode="legacy") as client:
        names = [t.name for t in (await client.list_tools()).tools]
        said = await client.call_tool("complete_phase", {"summary": "the CLI"})
        assert said.content[0].text == "ok: complete_phase"
        if while_connected is not None:
            await asyncio.to_thread(while_connected)
    return names


def test_the_cli_reaches_its_tools_and_a_later_process_does_not(server, tmp_path):
    # The attack, while the socket listens: a process that connects calls complete_phase.
    with server.listening():
        assert f"MCP {server.socket} REACHED" in probe(tmp_path, server.socket)
    assert server.calls == ["the probe"]
    server.calls.clear()
    # With the relay connected first, as a CLI starts it before the model's first turn, the
    # same command, run during the CLI's session, reaches nothing: the listener is gone.
    seen = {}
    with server.listening():
        names = asyncio.run(as_the_cli(server, lambda: seen.update(said=probe(tmp_path, server.socket))))
    assert names == ["run_experiment", "experiment_output", "stop_experiment", "complete_phase"]
    assert server.calls == ["the CLI"]
    assert f"MCP {server.socket} REFUSED" in seen["said"] and "REACHED" not in seen["said"], seen["said"]
    assert not server.socket.exists()


def test_a_second_connection_at_the_socket_path_is_refused_and_a_second_relay_says_so(server):
    # Bound where the CLI runs, the path outlives the listener: connecting there finds no one.
    import socket

    def again() -> None:
        late = socket.socket(socket.AF_UNIX)
        with pytest.raises(OSError):
            late.connect(str(server.socket))
        second = subprocess.run(relay(server.socket), input="", capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert second.stderr.count("\n") == 1 and "takes one per run" in second.stderr, second.stderr

    with server.listening():
        asyncio.run(as_the_cli(server, again))


def test_each_run_has_its_own_connection_and_a_run_that_never_connects_leaves_nothing(server):
    for _ in range(2):  # a phase's runs: the same path, a listener again for each
        with server.listening():
            asyncio.run(as_the_cli(server))
    with server.listening():
        assert server.socket.exists()
    assert not server.socket.exists()
    assert server.calls == ["the CLI", "the CLI"]


def test_the_mcp_config_is_the_relay_and_holds_no_secret(server):
    config = server.mcp_config()
    assert config == {"mcpServers": {"labrun": {"type": "stdio", "command": relay(server.socket)[0],
                                                "args": relay(server.socket)[1:]}}}
    said = json.dumps(config)
    assert "token" not in said.lower() and "authorization" not in said.lower() and "http" not in said
    assert server.socket.parent.stat().st_mode & 0o777 == 0o700 and server.socket.parent.parent == Path("/tmp")


def test_a_call_whose_cli_died_before_the_engine_took_it_is_not_run():
    """The journal's rule (`run_call`): a call the client gave up on does not run. No engine
    thread takes the call here, so it waits; the CLI's relay dies; the call is cancelled."""
    inbox: queue.Queue = queue.Queue()
    hello = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                 "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "complete_phase", "arguments": {}}}]
    with ToolServer(inbox) as own, own.listening():
        cli = subprocess.Popen(relay(own.socket), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        cli.stdin.write("".join(json.dumps(m) + "\n" for m in hello).encode())
        cli.stdin.flush()
        assert b'"id":1' in cli.stdout.readline()
        _, call = inbox.get(timeout=10)
        cli.kill()
        cli.wait()
        for _ in range(100):  # the session ends as the relay's end closes
            if call.future.cancelled():
                break
            threading.Event().wait(0.05)
        assert call.future.cancelled()
