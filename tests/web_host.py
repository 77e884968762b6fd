"""A web server that agent commands can reach: a folder served over HTTP on a host of its own.

Agent commands reach only the internet, through labrun's egress proxy, never this machine's
loopback. So where bubblewrap sandboxes them, the test host is a network namespace made here,
joined to this one by a veth pair on a prefix that is global but used by no one: 192.88.99.0/24,
6to4's relay anycast, deprecated by RFC 7526. The proxy admits only global addresses (a
documentation prefix would be refused), and a route through the veth keeps every packet on the
machine. That
needs root and iproute2; without them the test skips (in CI it fails: CI has both). Where
commands run unsandboxed (no bubblewrap), the folder is served on the loopback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

from support import wait_for


def _up(url: str) -> bool:
    return subprocess.run(["curl", "-s", "-f", "--noproxy", "*", "-o", "/dev/null", url],
                          capture_output=True).returncode == 0


@contextlib.contextmanager
def serving(folder: Path, probe: str) -> Iterator[str]:
    """The base URL at which `folder` is served; `probe`, a file in it, tells when it is up."""
    import pytest

    from labrun.sandbox import bubblewrap

    if bubblewrap() is None:
        with _served(folder, [], "127.0.0.1") as url:
            wait_for(lambda: _up(f"{url}/{probe}"), timeout=20, what="the web server")
            yield url
        return
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a test host for sandboxed commands needs root and iproute2 (`ip`) to make its network namespace")
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"lrt-{tag}", f"lrh{tag}", f"lrp{tag}"
    subnet = 4 * (int(tag, 16) % 60 + 1)  # a /30 of the prefix, so that runs side by side differ
    host_ip, peer_ip = f"192.88.99.{subnet + 1}", f"192.88.99.{subnet + 2}"

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True)

    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        sh("ip", "link", "set", there, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", here)
        sh("ip", "link", "set", here, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{peer_ip}/30", "dev", there)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", there, "up")
        with _served(folder, ["ip", "netns", "exec", ns], peer_ip) as url:
            wait_for(lambda: _up(f"{url}/{probe}"), timeout=20, what="the test host")
            yield url
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextlib.contextmanager
def _served(folder: Path, prefix: list[str], address: str) -> Iterator[str]:
    import socket

    port = 8000
    if not prefix:  # the loopback: a free port
        with socket.socket() as s:
            s.bind((address, 0))
            port = s.getsockname()[1]
    server = subprocess.Popen([*prefix, sys.executable, "-m", "http.server", str(port), "--bind", address,
                               "--directory", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"http://{address}:{port}"
    finally:
        server.kill()
        server.wait()
