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

from labrun.egress import Refused, checked_address, named_endpoints, policy


class EgressFilter(HttpProxyBasePlugin):
    """proxy.py's hook: check the address before connecting, then connect to that address."""

    def before_upstream_connection(self, request):
        domains, own = policy()
        host, port = request.host.decode().strip("[]"), request.port
        try:
            self.checked = checked_address(host, port, domains, own,
                                           named_endpoints(Path(self.flags.unix_socket_path).parent))
        except Refused as e:
            raise HttpRequestRejected(status_code=403, reason=b"Forbidden",
                                      body=f"labrun sandbox: {e}\n".encode()) from None
        return request

    def resolve_dns(self, host: str, port: int):
        return getattr(self, "checked", None), None


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
