"""The egress proxy's one rule, attacked: the sandbox connects only to a global unicast address
(and the IPv4 address it carries) that is not one of the machine's, read at connect time.

The red team reached a host on 198.18.0.0/15 through the old deny-list, and an address added to
an interface after the proxy started. The end-to-end tests attack the real proxy process in two
network namespaces that they make themselves (root and iproute2): a "machine" running the proxy
and a "far host" joined to it by a veth pair. No packet goes anywhere else.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings, strategies as st

from labrun import egress
from labrun.egress import EgressProxy, Refused, checked_address, refusal

ip = ipaddress.ip_address

OLD_DENY_LIST = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4", "::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
))
"""The weak target: the list labrun refused before, which let through every range it did not name."""

NOT_ON_THE_INTERNET = {
    "benchmarking (198.18.0.0/15)": ["198.18.0.1", "198.19.255.254"],
    "reserved (240.0.0.0/4)": ["240.0.0.1", "255.255.255.254"],
    "documentation": ["192.0.2.1", "198.51.100.1", "203.0.113.1", "2001:db8::1"],
    "shared address space": ["100.64.0.1", "100.127.255.254"],
    "private, loopback, unspecified, broadcast": ["10.1.2.3", "172.16.0.1", "192.168.1.1", "127.0.0.1",
                                                  "0.0.0.0", "255.255.255.255", "::1", "::"],
    "link-local, cloud metadata": ["169.254.169.254", "fe80::1"],
    "IPv6 unique local": ["fd00::1", "fc00::1"],
    "multicast (is_global calls it global)": ["224.0.0.1", "239.255.255.250", "ff0e::1", "ff02::1"],
    "IPv4-mapped": ["::ffff:198.18.0.1", "::ffff:127.0.0.1", "::ffff:10.0.0.1"],
    "NAT64 of a non-global IPv4": ["64:ff9b::c612:1", "64:ff9b::a00:1", "64:ff9b::7f00:1"],
    "local-use NAT64": ["64:ff9b:1::808:808", "64:ff9b:1:0:8:808:800:0"],
    "6to4 of a non-global IPv4": ["2002:c612:1::1", "2002:a00:1::1", "2002:7f00:1::1"],
    "IPv4-compatible of a non-global IPv4": ["::c612:1", "::a00:1", "::7f00:1"],
    "Teredo": ["2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:0:808:808:0:0:f5ff:fffe"],
}
ON_THE_INTERNET = ["8.8.8.8", "1.1.1.1", "192.88.99.1", "2606:4700:4700::1111", "::ffff:8.8.8.8",
                   "64:ff9b::808:808", "2002:808:808::1"]


@pytest.mark.parametrize("address", [a for group in NOT_ON_THE_INTERNET.values() for a in group])
def test_every_address_not_on_the_internet_is_refused(address):
    assert refusal(ip(address), own=set()) is not None


def test_what_the_deny_list_and_is_global_alone_let_through_the_rule_refuses():
    holes = ["198.18.0.1", "198.19.255.254", "192.0.2.1", "198.51.100.1", "203.0.113.1", "2001:db8::1",
             "2002:a00:1::1", "64:ff9b::c612:1", "::ffff:198.18.0.1"]
    assert not [a for a in holes if any(ip(a) in net for net in OLD_DENY_LIST)], "the weak target refused these"
    carrying = ["2002:a00:1::1", "2002:7f00:1::1", "64:ff9b::a00:1", "::a00:1", "::7f00:1"]
    assert all(ip(a).is_global for a in carrying), "is_global alone would admit these"
    assert [a for a in holes + carrying if refusal(ip(a), own=set()) is None] == []


@pytest.mark.parametrize("address", ON_THE_INTERNET)
def test_a_global_address_is_admitted_unless_it_or_what_it_carries_is_the_machines(address):
    assert refusal(ip(address), own=set()) is None
    for own in egress.carried(ip(address)):
        assert "an address of this machine" in refusal(ip(address), own={own})


def test_a_refusal_is_one_line_naming_the_address():
    with pytest.raises(Refused) as e:
        checked_address("localhost", 80, None)
    said = str(e.value)
    assert said.startswith("localhost: ") and " is an address of this machine; " in said and "\n" not in said
    with pytest.raises(Refused) as e:
        checked_address("198.18.0.1", 80, None)
    assert str(e.value) == ("198.18.0.1 is not a global internet address; "
                            "the sandbox reaches only hosts on the internet")


# The property: random addresses, and IPv6 addresses carrying a random IPv4 one, built here from
# the RFCs' layouts, against a spec that is Python's is_global and nothing of labrun's.
def _teredo(server, client, rest):
    return ipaddress.IPv6Address((0x20010000 << 96) | (int(server) << 64) | (rest << 32) | (int(client) ^ 0xFFFFFFFF))


CARRIERS = {
    "mapped": lambda v4, rest: ipaddress.IPv6Address((0xFFFF << 32) | int(v4)),
    "compatible": lambda v4, rest: ipaddress.IPv6Address(int(v4)),
    "NAT64": lambda v4, rest: ipaddress.IPv6Address((0x64FF9B << 96) | int(v4)),
    "6to4": lambda v4, rest: ipaddress.IPv6Address((0x2002 << 112) | (int(v4) << 80) | (rest & (1 << 80) - 1)),
}
CARRYING_PREFIXES = [ipaddress.ip_network(n) for n in ("::/96", "::ffff:0:0/96", "64:ff9b::/32", "2002::/16",
                                                       "2001::/32")]


@st.composite
def addresses_and_machines(draw):
    """(an address, what a connection to it may reach, the machine's addresses)."""
    kind = draw(st.sampled_from(["plain", "Teredo", "local NAT64", *CARRIERS]))
    v4, other, rest = draw(st.ip_addresses(v=4)), draw(st.ip_addresses(v=4)), draw(st.integers(0, 2**80 - 1))
    if kind == "plain":
        address = draw(st.ip_addresses().filter(lambda a: not any(a in n for n in CARRYING_PREFIXES)))
        reached = [address]
    elif kind == "Teredo":
        address = _teredo(other, v4, rest & 0xFFFFFFFF)
        reached = [address, other, v4]
    elif kind == "local NAT64":
        address = ipaddress.IPv6Address((0x64FF9B0001 << 80) | (rest & (1 << 80) - 1))
        reached = [address, None]  # an IPv4 address where the operator put it: none can be judged
    else:
        address = CARRIERS[kind](v4, rest)
        reached = [address, v4]
    own = draw(st.sets(st.ip_addresses(), max_size=2)) | draw(st.sets(st.sampled_from(reached), max_size=1))
    return address, reached, own - {None}


def on_the_internet(reached, own) -> bool:
    return all(a is not None and a.is_global and not a.is_multicast and a not in own for a in reached)


@settings(max_examples=2000, deadline=None)
@given(addresses_and_machines())
def test_the_rule_admits_exactly_global_unicast_addresses_that_are_not_the_machines(case):
    address, reached, own = case
    assert (refusal(address, own) is None) == on_the_internet(reached, own), (address, reached, own)


def _machine() -> set:
    return {ip(a.address.split("%")[0]) for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}


@settings(max_examples=300, deadline=None)
@given(st.ip_addresses().filter(lambda a: not any(a in n for n in CARRYING_PREFIXES))
       | st.sampled_from(sorted(_machine(), key=str)))
def test_the_proxy_admits_exactly_the_global_unicast_addresses_not_of_this_machine(address):
    """The proxy's own check, through name resolution, against this machine's real addresses."""
    try:
        admitted = ip(checked_address(str(address), 443, None)) == address
    except Refused:
        admitted = False
    assert admitted == on_the_internet([address], _machine()), address


# End to end: the real proxy process, in namespaces made here.
SERVE = """
import socket, sys
server = socket.create_server(("::", int(sys.argv[2])), family=socket.AF_INET6, dualstack_ipv6=True)
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(sys.argv[1].encode() + b"\\n")
    conn.close()
"""
DIAL = """
import json, socket, sys
out = {}
for host in json.loads(sys.argv[1]):
    try:
        with socket.create_connection((host, int(sys.argv[2])), timeout=3) as s:
            out[host] = s.recv(100).decode().strip()
    except OSError as e:
        out[host] = repr(e)
print(json.dumps(out))
"""
PORT = 8000
FAR = {"198.18.0.0/24": "benchmarking", "240.0.0.0/24": "reserved", "192.0.2.0/24": "documentation",
       "198.51.100.0/24": "documentation", "203.0.113.0/24": "documentation", "100.64.0.0/24": "shared",
       "192.88.99.0/24": "global", "fd00:5::/64": "IPv6 unique local", "2001:db8:5::/64": "IPv6 documentation"}
"""The far host's networks: it is .2 (::2) on each, the machine .1 (::1)."""


def _host(net: str, n: int) -> str:
    return str(ipaddress.ip_network(net)[n])


@contextlib.contextmanager
def namespace_pair():
    """Two network namespaces, `machine` and `far`, joined by a veth pair carrying `FAR`."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the end-to-end egress tests need root and iproute2 (`ip`) to make network namespaces")
    tag = uuid.uuid4().hex[:6]
    machine, far = f"lre-m-{tag}", f"lre-f-{tag}"

    def sh(*cmd: str) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr.strip()}"

    try:
        sh("ip", "netns", "add", machine)
        sh("ip", "netns", "add", far)
        sh("ip", "-n", machine, "link", "add", "m0", "type", "veth", "peer", "name", "f0", "netns", far)
        for ns, dev, n in ((machine, "m0", 1), (far, "f0", 2)):
            for net in FAR:
                sh("ip", "-n", ns, "addr", "add", f"{_host(net, n)}/{net.split('/')[1]}", "dev", dev,
                   *(["nodad"] if ":" in net else []))
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield machine, far
    finally:
        for ns in (machine, far):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextlib.contextmanager
def serving(ns: str, tag: str):
    server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVE, tag, str(PORT)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        yield
    finally:
        server.kill()
        server.wait()


@contextlib.contextmanager
def proxy_in(ns: str, tmp_path: Path, monkeypatch):
    """labrun's proxy, started as the engine starts it, but in the namespace `ns`."""
    shim = tmp_path / "python-in-namespace"
    shim.write_text(f'#!/bin/sh\nexec ip netns exec {ns} {sys.executable} "$@"\n')
    shim.chmod(0o755)
    proxy = EgressProxy(None)
    with monkeypatch.context() as m:
        m.setattr(sys, "executable", str(shim))
        sock = proxy.start()
    try:
        yield sock
    finally:
        proxy.stop()


def dial(ns: str, hosts: list[str]) -> dict:
    """What connecting straight to each host from `ns` reads: the weak target, no proxy at all."""
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", DIAL, json.dumps(hosts), str(PORT)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def through(sock: Path, host: str) -> str:
    """What a CONNECT through the proxy at `sock` to `host` reads: the answer and the tunnel's data."""
    target = f"[{host}]:{PORT}" if ":" in host else f"{host}:{PORT}"
    got = b""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        with contextlib.suppress(TimeoutError):
            while (chunk := s.recv(4096)) and b"hello" not in got and b"labrun sandbox" not in got:
                got += chunk
    return got.decode(errors="replace")


def test_the_proxy_reaches_only_a_global_far_host(tmp_path, monkeypatch):
    plain = [_host(net, 2) for net in FAR]
    mapped = ["::ffff:198.18.0.2", "::ffff:100.64.0.2"]
    with (namespace_pair() as (machine, far), serving(far, "hello from far"),
          proxy_in(machine, tmp_path, monkeypatch) as sock):
        direct = dial(machine, plain + mapped)
        assert set(direct.values()) == {"hello from far"}, f"a probe that fails without the proxy proves nothing: {direct}"
        answers = {t: through(sock, t) for t in plain + mapped}
        assert [t for t, said in answers.items() if "hello from far" in said] == ["192.88.99.2"], answers
        for t in set(plain) - {"192.88.99.2"}:
            assert f"labrun sandbox: {t} is not a global internet address" in answers[t], answers[t]
        for t in mapped:
            assert f"carries {t.removeprefix('::ffff:')}, which is not a global internet address" in answers[t]


def test_an_address_added_to_the_machine_after_the_proxy_started_is_refused(tmp_path, monkeypatch):
    """The far host's global address, once admitted, is added to the machine's loopback: a
    connection to it now reaches the machine's own listener, and the proxy refuses it."""
    target = "192.88.99.2"
    with (namespace_pair() as (machine, far), serving(far, "hello from far"),
          serving(machine, "hello from the machine"), proxy_in(machine, tmp_path, monkeypatch) as sock):
        assert "hello from far" in through(sock, target)
        read = "import json; from labrun.egress import own_addresses; print(json.dumps(sorted(map(str, own_addresses()))))"
        at_start = subprocess.run(["ip", "netns", "exec", machine, sys.executable, "-c", read],
                                  capture_output=True, text=True, check=True).stdout
        subprocess.run(["ip", "-n", machine, "addr", "add", f"{target}/32", "dev", "lo"], check=True)
        # The weak target: the machine's addresses as read when the proxy started admit it, and
        # it now reaches the machine itself.
        assert refusal(ip(target), {ip(a) for a in json.loads(at_start)}) is None
        assert dial(machine, [target]) == {target: "hello from the machine"}
        said = through(sock, target)
        assert "hello" not in said and f"labrun sandbox: {target} is an address of this machine" in said, said
