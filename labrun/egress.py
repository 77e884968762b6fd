"""The only way out of the sandbox: an HTTP(S) proxy on the engine's side of a Unix socket.

Agent commands run in a network namespace of their own (`labrun.sandbox`): they see no
loopback service of the machine, no abstract Unix socket, no Prefect API. What they may
reach goes through this proxy, as in Claude Code's sandbox runtime: the sandbox gets the
proxy's Unix socket bound in, a bridge inside listens on the sandbox's own loopback
(`labrun.netbridge`), and `HTTP_PROXY`/`HTTPS_PROXY` point there, so pip, uv, git over
HTTPS, curl and the Hugging Face hub work as usual.

The proxy is proxy.py (abhinavsingh/proxy.py: HTTP forwarding and CONNECT tunnels, no TLS
interception) with one plugin (`labrun.egress_proxy`, the proxy's own process). It resolves the
name a client asked for and connects only to an address out on the internet: one rule, allow by
construction (`refusal`), so a range nobody listed (benchmarking, documentation, reserved) is
refused as surely as loopback. The rule is judged on the exact address the proxy then connects
to, so a name that resolves differently a moment later (DNS rebinding) gains nothing, and
against the machine's addresses as they are at that moment, so one added to an interface after
the proxy started is refused too. A session may narrow egress to a list of domains (the idea's
`constraints.allowed_domains`): a domain admits itself and its subdomains.

A coding CLI in a network namespace of labrun's must still reach its model API, which may be on
the engine's loopback (a gateway, or the tests' scripted API): such a CLI gets a proxy of its
own, started for that endpoint (`endpoints`: host and port), which it lets through whatever its
address. The session's commands (`bash`, `run_experiment`, reruns) go through a proxy started
with none, so no command of theirs reaches a loopback endpoint at all.

The policy reaches the proxy's process in its environment when it starts (the domains, the
endpoints), and nothing changes it after.
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

DOMAINS_VAR = "LABRUN_EGRESS_DOMAINS"
"""JSON list of the domains a session may reach; unset means any."""
ENDPOINTS_VAR = "LABRUN_EGRESS_ENDPOINTS"
"""JSON list of the `host:port`s a coding CLI's own proxy lets through whatever their address."""
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


def own_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """This machine's addresses now: read for each connection, since one added to an interface
    after the proxy started is the machine's all the same."""
    import psutil

    return {ipaddress.ip_address(a.address.split("%")[0])
            for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}


LOW_32_BITS = (ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96"))
"""IPv6 prefixes whose addresses carry an IPv4 address in their last 32 bits: IPv4-compatible
(a kernel may tunnel them) and NAT64's well-known prefix."""
LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")
"""NAT64 for local use (RFC 8215): where it carries the IPv4 address is the operator's choice,
so it cannot be judged. Python before 3.11.10 and 3.12.4 calls it global; IANA does not."""


def carried(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list:
    """`ip` and the IPv4 addresses it carries (mapped, IPv4-compatible, NAT64, 6to4, Teredo's
    server and client): a connection to it may reach any of them."""
    if ip.version == 4:
        return [ip]
    inner = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
    if any(ip in net for net in LOW_32_BITS):
        inner.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return [ip, *filter(None, inner)]


def refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, own) -> str | None:
    """Why the sandbox may not connect to `ip`, or None. The one rule: `ip` and every address it
    carries are unicast addresses on the internet (`is_global`: Python's copy of IANA's
    special-purpose registries) and none is one of `own`, the machine's."""
    if ip in LOCAL_NAT64:
        return f"{ip} is local-use NAT64, not a global internet address"
    for a in reversed(carried(ip)):  # what it carries first: the more telling refusal
        said = str(ip) if a == ip else f"{ip} carries {a}, which"
        if a in own:
            return f"{said} is an address of this machine"
        if not a.is_global or a.is_multicast:  # is_global admits multicast, which is no host
            return f"{said} is not a global internet address"
    return None


def domain_allowed(host: str, domains: Iterable[str] | None) -> bool:
    if domains is None:
        return True
    host = host.rstrip(".").lower()
    return any(host == d or host.endswith("." + d) for d in domains)


def checked_address(host: str, port: int, domains: list[str] | None, endpoints: Iterable[str] = ()) -> str:
    """The address to connect to for `host`, or `Refused` saying why not; call it just before
    connecting, and connect to what it returns. `endpoints`: the `host:port`s the engine named,
    reached whatever their address."""
    named = f"{host.lower()}:{port}" in endpoints
    if not named and not domain_allowed(host, domains):
        raise Refused(f"{host} is not among this session's allowed domains ({', '.join(domains)})")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise Refused(f"{host} does not resolve ({e.strerror})") from None
    except UnicodeError:  # a label over 63 characters, or one IDNA cannot encode
        raise Refused(f"{host[:80]} is not a host name") from None
    if named:
        return infos[0][4][0]
    own = own_addresses()
    why = None
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(sockaddr[0].split("%")[0])
        why = refusal(ip, own)
        if why is None:
            return str(ip)
    try:
        said = why if ipaddress.ip_address(host) == ip else f"{host}: {why}"
    except ValueError:  # a name
        said = f"{host}: {why}"
    raise Refused(f"{said}; the sandbox reaches only hosts on the internet")


def endpoint(url: str) -> str:
    """`host:port` of a URL, as the proxy compares it."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{(parts.hostname or '').lower()}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


@lru_cache(maxsize=1)
def session_domains() -> list[str] | None:
    """In the proxy's process: the session's domains (None: any)."""
    raw = os.environ.get(DOMAINS_VAR)
    return None if raw is None else json.loads(raw)


@lru_cache(maxsize=1)
def named_endpoints() -> frozenset[str]:
    """In the proxy's process: the endpoints it was started for (a coding CLI's own proxy)."""
    return frozenset(json.loads(os.environ.get(ENDPOINTS_VAR) or "[]"))


LIFELINES: dict[str, int] = {}
"""The write end of the stdin of each proxy this process started, by its socket: an attempt's
supervisor holds a copy (`labrun.commands.start_supervised`), so that an attempt that outlives
the engine keeps its way out, and the proxy ends with the last of them."""


class EgressProxy:
    """The proxy's process for one session: started on its first sandboxed command that may
    use the network, gone at `stop` or with the engine, however the engine ends (its stdin is
    a pipe that only the engine holds open: a parent-death signal would come when the
    thread that started it ended)."""

    def __init__(self, domains: list[str] | None, endpoints: Iterable[str] = ()):
        self.domains = domains
        self.endpoints = sorted({endpoint(u) for u in endpoints})
        """URLs whose `host:port` it reaches whatever their address: only in a coding CLI's own
        proxy (its model API), never in the one of the session's commands."""
        # 0700, a short path, and under the machine's /tmp, which every sandbox replaces with
        # its own (TMPDIR may name a folder a sandbox shows: its socket would be in reach).
        self.folder = Path(tempfile.mkdtemp(prefix="labrun-egress-", dir="/tmp"))
        self.socket = self.folder / "proxy.sock"
        self.log = self.folder / "proxy.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Path:
        path = self._start()
        assert self.proc is not None and self.proc.stdin is not None
        LIFELINES[str(path)] = self.proc.stdin.fileno()
        return path

    def _start(self) -> Path:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LABRUN_EGRESS_")}
        if self.domains is not None:
            env[DOMAINS_VAR] = json.dumps(self.domains)
        if self.endpoints:
            env[ENDPOINTS_VAR] = json.dumps(self.endpoints)
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
        LIFELINES.pop(str(self.socket), None)
        if self.proc is not None:
            self.proc.stdin.close()  # the proxy kills its process group, and removes its folder
            try:
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                return  # an attempt's supervisor holds it too: it ends with that attempt
        shutil.rmtree(self.folder, ignore_errors=True)
