"""The egress proxy's own process (`labrun.egress.EgressProxy` starts it): proxy.py with
labrun's filter, imported here only, so that the engine never imports proxy.py.

`python -m labrun.egress_proxy <proxy.py's flags>` runs until its stdin closes: the engine's
end of that pipe closes when the engine stops it or dies, however it dies.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from pathlib import Path

from proxy import main as proxy_main
from proxy.http.exception import HttpRequestRejected
from proxy.http.proxy import HttpProxyBasePlugin

from labrun.egress import Refused, checked_address, named_endpoints, session_domains


class EgressFilter(HttpProxyBasePlugin):
    """proxy.py's hook: judge the address just before connecting, then connect to that address.

    proxy.py calls `before_upstream_connection` and then, in the same call, `resolve_dns` and
    connect: the check is made at connect time, on the address connected to (a refusal can only
    be answered in words from the first hook)."""

    checked: tuple[str, int, str] | None = None

    def before_upstream_connection(self, request):
        host, port = request.host.decode(), request.port
        self.checked = None
        try:
            address = checked_address(host.strip("[]"), port, session_domains(), named_endpoints())
        except Refused as e:
            raise HttpRequestRejected(status_code=403, reason=b"Forbidden",
                                      body=f"labrun sandbox: {e}\n".encode()) from None
        self.checked = (host, port, address)
        return request

    def resolve_dns(self, host: str, port: int):
        # Only the address just checked for this very host and port: never let proxy.py
        # resolve a name itself (None would).
        if self.checked is None or self.checked[:2] != (host, port):
            raise Refused(f"{host}:{port} was not checked")
        return self.checked[2], None


def main() -> None:
    """The proxy's process: proxy.py's own main, until its stdin closes (the engine ended or
    stopped it, however it ended)."""
    folder = Path(sys.argv[sys.argv.index("--unix-socket-path") + 1]).parent

    def exit_on_eof() -> None:
        # os.read, not sys.stdin: a fork (proxy.py's acceptors) must not find its lock held.
        while os.read(0, 4096):
            pass
        shutil.rmtree(folder, ignore_errors=True)  # also after a kill -9 of the engine
        os.killpg(0, signal.SIGKILL)  # with proxy.py's acceptor processes

    threading.Thread(target=exit_on_eof, daemon=True).start()
    proxy_main()


if __name__ == "__main__":
    main()
