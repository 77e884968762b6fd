"""The only way out of the sandbox: an HTTP(S) proxy on the engine's side of a Unix socket.

Agent commands run in a network namespace of their own (`labrun.sandbox`): they see no
loopback service of the machine, no abstract Unix socket, no Prefect API. What they may
reach goes through this proxy, as in Claude Code's sandbox runtime: the sandbox gets the
proxy's Unix socket bound in, a bridge inside listens on the sandbox's own loopback
(`labrun.netbridge`), and `HTTP_PROXY`/`HTTPS_PROXY` point there, so pip, uv, git over
HTTPS, curl and the Hugging Face hub work as usual.

The proxy is proxy.py (abhinavsingh/proxy.py: HTTP forwarding and CONNECT tunnels, no TLS
interception) with one plugin (`labrun.egress_proxy`, the proxy's own process). It resolves the name a client asked for,
refuses every address that is not out on the internet (loopback, link-local with the cloud
metadata address, private, carrier-grade NAT, multicast, unspecified, and the machine's own
addresses, IPv4 inside IPv6 included) and connects to the address it checked, so a name
that resolves differently a moment later (DNS rebinding) gains nothing. A session may narrow
egress to a list of domains (the idea's `constraints.allowed_domains`): a domain admits
itself and its subdomains.

A coding CLI that runs inside the sandbox (Gemini CLI) must still reach its model API and
labrun's MCP server, both maybe on the engine's loopback: the engine names those exact
endpoints (`allow_endpoints`, host and port), and the proxy lets them through whatever their
address. Nothing else of the engine's side is named, so nothing else is reached.

The policy reaches the proxy's process in its environment (the domains) and in a file beside
its socket (the endpoints), both only the engine's to write.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Iterable

BLOCKED_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
    "::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
))
"""Never reachable from the sandbox: the machine and the networks beside it, not the internet."""
DOMAINS_VAR = "LABRUN_EGRESS_DOMAINS"
"""JSON list of the domains a session may reach; unset means any."""
IDLE_TIMEOUT_S = 3600
"""How long a connection may carry nothing before the proxy drops it: proxy.py's default, 10 s,
would cut a model's stream while it thinks and a download while a server prepares it."""
BRIDGE_PORT = 3128
"""Where the bridge listens on the sandbox's own loopback."""
PROXY_URL = f"http://127.0.0.1:{BRIDGE_PORT}"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
"""What points a command's HTTP clients at `PROXY_URL`."""


class Refused(Exception):
    """Why the proxy will not connect, in words the agent can act on."""


def own_addresses() -> set[ipaddress._BaseAddress]:
    import psutil

    found = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                found.add(ipaddress.ip_address(a.address.split("%")[0]))
    return found


def embedded_ipv4(ip: ipaddress._BaseAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), which is what it reaches."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped:
            return ip.ipv4_mapped
        if ip.sixtofour:
            return ip.sixtofour
        if ip in ipaddress.ip_network("64:ff9b::/96"):
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_refusal(ip: ipaddress._BaseAddress, own: set) -> str | None:
    for candidate in filter(None, (ip, embedded_ipv4(ip))):
        if candidate in own:
            return "an address of this machine"
        if any(candidate in net for net in BLOCKED_NETWORKS):
            return "a loopback, private or link-local address"
    return None


def domain_allowed(host: str, domains: Iterable[str] | None) -> bool:
    if domains is None:
        return True
    host = host.rstrip(".").lower()
    return any(host == d or host.endswith("." + d) for d in domains)


def checked_address(host: str, port: int, domains: list[str] | None, own: set,
                    endpoints: Iterable[str] = ()) -> str:
    """The address to connect to for `host`, or `Refused` saying why not. `endpoints`: the
    `host:port`s the engine named, reached whatever their address."""
    named = f"{host.lower()}:{port}" in endpoints
    if not named and not domain_allowed(host, domains):
        raise Refused(f"{host} is not among this session's allowed domains ({', '.join(domains)})")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise Refused(f"{host} does not resolve ({e.strerror})") from None
    if named:
        return infos[0][4][0]
    why = None
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(sockaddr[0].split("%")[0])
        why = address_refusal(ip, own)
        if why is None:
            return str(ip)
    raise Refused(f"{host} is {why}: the sandbox reaches only the internet")


ENDPOINTS_FILE = "endpoints.json"


def endpoint(url: str) -> str:
    """`host:port` of a URL, as the proxy compares it."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{(parts.hostname or '').lower()}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def allow_endpoints(proxy_socket: Path, urls: Iterable[str]) -> None:
    """Let the proxy behind `proxy_socket` reach exactly these URLs' endpoints, besides the
    internet (replacing those allowed before)."""
    from labrun.workspace import write_atomic

    write_atomic(proxy_socket.parent / ENDPOINTS_FILE, json.dumps(sorted({endpoint(u) for u in urls})))


@lru_cache(maxsize=1)
def policy() -> tuple[list[str] | None, frozenset]:
    """In the proxy's process: the session's domains (None: any) and this machine's addresses."""
    raw = os.environ.get(DOMAINS_VAR)
    return (None if raw is None else json.loads(raw)), frozenset(own_addresses())


def named_endpoints(folder: Path) -> list[str]:
    """In the proxy's process: the endpoints the engine named last (`allow_endpoints`)."""
    try:
        return json.loads((folder / ENDPOINTS_FILE).read_text())
    except FileNotFoundError:
        return []


class EgressProxy:
    """The proxy's process for one session: started on its first sandboxed command that may
    use the network, gone at `stop` or with the engine, however the engine ends (its stdin is
    a pipe that only the engine holds open: a parent-death signal would come when the
    thread that started it ended)."""

    def __init__(self, domains: list[str] | None):
        self.domains = domains
        self.folder = Path(tempfile.mkdtemp(prefix="labrun-egress-"))  # 0700; a short path
        self.socket = self.folder / "proxy.sock"
        self.log = self.folder / "proxy.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Path:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LABRUN_EGRESS_")}
        if self.domains is not None:
            env[DOMAINS_VAR] = json.dumps(self.domains)
        with open(self.log, "ab") as log:
            # Its stdin is the lifeline: a pipe only this process holds open (`egress_proxy.main`).
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "labrun.egress_proxy", "--unix-socket-path", str(self.socket),
                 "--num-acceptors", "1", "--timeout", str(IDLE_TIMEOUT_S), "--log-level", "WARNING",
                 "--plugins", "labrun.egress_proxy.EgressFilter"],
                env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace").strip().splitlines()[-1:] if self.log.exists() else []
                raise RuntimeError(f"the sandbox's egress proxy did not start ({'; '.join(tail) or 'no output'})")
            time.sleep(0.05)
        return self.socket

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # the proxy kills its process group
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
