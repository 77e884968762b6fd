"""A coding CLI's MCP server for labrun's tools: a relay to the engine's Unix socket.

`python -I -c <this text> SOCKET` connects to SOCKET, where the engine accepts one
connection per CLI run (`labrun.mcp_tools.ToolServer.listening`), then carries bytes between
its stdin and stdout (the CLI's stdio MCP transport) and that connection, both ways, until
either side ends. The standard library only: it runs from its text on the interpreter labrun
runs on, inside the sandbox too (Gemini CLI), where labrun's package may not be visible.
"""

import os
import socket
import sys
import threading


def to_cli(engine: socket.socket) -> None:
    try:
        while data := engine.recv(65536):
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
    except OSError:
        pass
    os._exit(0)  # the engine ended the session: so does the relay, and the CLI sees its server gone


def undumpable() -> None:
    """No process of the same user may take a copy of the relay's connection (`pidfd_getfd`,
    `/proc/PID/fd`) or read its memory: inside Gemini CLI's sandbox the CLI's shell is such a
    process, and without capabilities it cannot attach to a process that is not dumpable."""
    import ctypes

    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def main(path: str) -> int:
    undumpable()
    engine = socket.socket(socket.AF_UNIX)
    try:
        engine.connect(path)
    except OSError as e:
        print(f"labrun's MCP relay: the engine takes no connection at {path} ({e.strerror}): it takes one per "
              "run, and this run's is taken", file=sys.stderr)
        return 1
    back = threading.Thread(target=to_cli, args=(engine,), daemon=True)
    back.start()
    try:
        while data := sys.stdin.buffer.read1(65536):
            engine.sendall(data)
        engine.shutdown(socket.SHUT_WR)  # the CLI closed its end: the engine's side ends its session
    except OSError:
        return 0
    back.join()  # what the engine still sends, until it closes
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
