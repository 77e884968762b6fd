"""Inside the sandbox: the bridge from its own loopback to the egress proxy's Unix socket.

`python -I -c "$(cat netbridge.py)" PORT SOCKET [LIFELINE]` listens on 127.0.0.1:PORT in the
sandbox's network namespace, then goes to the background and returns, so that the command
it precedes finds it listening; with LIFELINE (a descriptor), it ends when that pipe closes. Each connection is carried, byte for byte, to a new connection to SOCKET (the
proxy on the engine's side, `labrun.egress`). The standard library only: it runs on the
interpreter labrun runs on, with nothing imported from labrun. Claude Code's sandbox
runtime uses socat for the same job; labrun does not depend on socat being installed.
"""

import os
import socket
import sys
import threading


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def carry(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(port: int, path: str, lifeline: int | None = None) -> None:
    listener = socket.create_server(("127.0.0.1", port), backlog=128)
    if os.fork():  # the caller goes on once the bridge listens
        os._exit(0)
    if lifeline is not None:  # no PID namespace ends it: it goes when the engine's end closes
        def watch() -> None:
            while os.read(lifeline, 64):
                pass
            os._exit(0)
        threading.Thread(target=watch, daemon=True).start()
    while True:
        client, _ = listener.accept()
        threading.Thread(target=carry, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
