"""A hostile agent against the sandbox, through the real tools (`bash` and `run_experiment`).

One payload tries every way out that issue 21 names. It is run twice: on the machine
itself, where each probe must succeed (so that a probe that can never work proves
nothing), and from inside the sandbox, where each must fail. Egress is tried against a
test host in a network namespace this test makes (root and iproute2), never an address
off this machine. In CI these tests fail rather than skip when bubblewrap is missing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import uuid
import zipfile
from pathlib import Path

import psutil
import pytest
import yaml

from support import DEMO_IDEA, wait_for
from web_host import serving
from labrun import sandbox
from labrun.mcp_tools import ToolServer
from labrun.phase_registry import BY_KEY
from labrun.phases.phase import toolbox
from labrun.session import Session


pytestmark = pytest.mark.usefixtures("bubblewrap_works")


PAYLOAD = r'''
import json, os, socket, sys, urllib.request
t = json.loads(sys.argv[1])
out = {}

def probe(name, fn):
    try:
        out[name] = bool(fn())
    except Exception as e:
        out[name] = False

def tcp(host, port):
    with socket.create_connection((host, port), timeout=3) as s:
        return s.recv(100).startswith(b"hello")

def via_proxy(url):
    # The sandbox's proxy, named outright: whatever NO_PROXY says, ask the proxy for it.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:3128"}))
    with opener.open(url, timeout=5) as r:
        return r.status < 500

def http(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=5) as r:
            return True
    except urllib.error.HTTPError as e:  # an answer all the same: the server was reached
        return e.code != 403 or b"labrun sandbox" not in e.read()

def abstract(name):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    s.connect("\0" + name)
    return True

def unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    s.connect(path)
    return True

def listed(prefix):
    return any(line.split()[-1].startswith("@" + prefix) for line in open("/proc/net/unix").readlines()[1:]
               if len(line.split()) > 7)

def environ(pid, marker):
    return marker.encode() in open(f"/proc/{pid}/environ", "rb").read()

def write(path):
    with open(path, "w") as f:
        f.write("escaped")
    return True

def read(path):
    return bool(os.listdir(path)) if os.path.isdir(path) else bool(open(path, "rb").read())

probe("loopback listener", lambda: tcp("127.0.0.1", t["port"]))
probe("own address listener", lambda: tcp(t["own"], t["port"]))
probe("Prefect API", lambda: http(t["prefect"] + "/health"))
probe("MCP socket of another session", lambda: unix(t["mcp"]))
probe("abstract socket", lambda: abstract(t["abstract"]))
probe("@labrun socket listed", lambda: listed("labrun-"))
probe("environ of the engine's side", lambda: environ(t["pid"], t["marker"]))
probe("write outside the workspace", lambda: write(t["outside"]))
probe("write .labrun", lambda: write(t["labrun"]))
probe("read a credential store", lambda: read(t["ssh"]))
probe("read Prefect's home", lambda: read(t["prefect_home"]))
if t["inside"]:
    for name, url in t["proxied"].items():
        probe("proxy to " + name, lambda url=url: via_proxy(url))
    out["engine variables"] = sorted(k for k in os.environ if k.startswith(("PREFECT_", "LABRUN_")))
print("RESULT " + json.dumps(out))
'''


@pytest.fixture
def listener():
    """A TCP server on every address of the machine: loopback and its own."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"hello from outside\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def secret_holder():
    """A process whose environment holds a secret, as the engine's and a CLI's do."""
    marker = f"marker-{uuid.uuid4().hex}"
    proc = subprocess.Popen(["sleep", "300"], env={"HOLDER_TOKEN": marker})
    yield proc.pid, marker
    proc.kill()
    proc.wait()


def own_address() -> str:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.skip("this machine has no address but loopback")


def test_a_hostile_command_reaches_nothing_of_the_engines_side(tmp_path, prefect_api, listener, abstract_socket,
                                                               secret_holder, monkeypatch):
    home = tmp_path / "home"  # the user's home, with a key in it
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    monkeypatch.setenv("HOME", str(home))
    prefect_home = Path(os.environ["PREFECT_HOME"])
    # Outside the workspace and outside /tmp, whose paths the sandbox's private /tmp mirrors.
    escaped = Path("/var/tmp") / f"labrun-escaped-{uuid.uuid4().hex}.txt"
    (prefect_home / "probe.txt").write_text("the database lies here")
    s = Session.open(tmp_path / "ws", DEMO_IDEA, "scripted")
    try:
        with ToolServer(queue.Queue()) as mcp:  # another session's
            port, own, (pid, marker) = listener, own_address(), secret_holder
            targets = {
                "port": port, "own": own, "prefect": prefect_api, "mcp": str(mcp.socket),
                "abstract": abstract_socket, "pid": pid, "marker": marker,
                "outside": str(escaped), "labrun": str(s.ws.data / "escaped.txt"),
                "ssh": str(home / ".ssh" / "id_ed25519"), "prefect_home": str(prefect_home),
                "proxied": {name: f"http://{host}:{port}/" for name, host in {
                    "loopback": "127.0.0.1", "localhost": "localhost", "127.1": "127.1",
                    "a decimal loopback": "2130706433", "IPv4 in IPv6": "[::ffff:127.0.0.1]",
                    "0.0.0.0": "0.0.0.0", "IPv6 loopback": "[::1]", "this machine's address": own,
                    "the Prefect API": prefect_api.split("//")[1].split("/")[0].split(":")[0],
                }.items()} | {"the cloud metadata address": "http://169.254.169.254/latest/meta-data/",
                              "the Prefect API's port": prefect_api + "/health"},
            }
            with mcp.listening():  # it takes one connection: the probe's, here
                outside = run_payload_here(targets)
            assert all(outside.values()), f"a probe that fails even outside the sandbox proves nothing: {outside}"
            escaped.unlink()
            (s.ws.data / "escaped.txt").unlink()

            (s.ws.root / "payload.py").write_text(PAYLOAD)
            inside = {**targets, "inside": True}
            box = toolbox(s, BY_KEY["experiments"])
            with mcp.listening():
                by_bash = box.call("bash", {"command": f"python3 payload.py {shlex.quote(json.dumps(inside))}"}).content
            with mcp.listening():
                attempt = box.call("run_experiment", {"command": f"python3 payload.py {shlex.quote(json.dumps(inside))}",
                                                      "purpose": "try every way out"}).content
            for said in (by_bash, attempt):
                got = result(said)
                assert got.pop("engine variables") == [], said
                assert not [k for k, reached in got.items() if reached], said
                assert len(got) == len(outside) + len(targets["proxied"])
                assert not escaped.exists() and not (s.ws.data / "escaped.txt").exists()
    finally:
        s.close()
        escaped.unlink(missing_ok=True)


def result(said: str) -> dict:
    lines = [line for line in said.splitlines() if line.startswith("RESULT ")]
    assert lines, said
    return json.loads(lines[-1][len("RESULT "):])


def run_payload_here(targets: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", PAYLOAD, json.dumps({**targets, "inside": False})],
                         capture_output=True, text=True, timeout=120)
    return result(out.stdout + out.stderr)


# -- what the sandbox may still do ---------------------------------------------------------------

def probe_wheel(folder: Path) -> Path:
    """A real wheel of one module (`labrun_probe`, VALUE = 42), RECORD and all."""
    files = {"labrun_probe/__init__.py": b"VALUE = 42\n",
             "labrun_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: labrun-probe\nVersion: 1.0\n",
             "labrun_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: labrun-tests\n"
                                                 b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files.items()]
    files["labrun_probe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\nlabrun_probe-1.0.dist-info/RECORD,,\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "labrun_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        pytest.skip("uv is not installed (it is in labrun's test extra)")
    return found


def test_pip_and_uv_install_into_a_workspace_venv_with_the_sessions_caches(tmp_path):
    s = Session.open(tmp_path / "ws", DEMO_IDEA, "scripted")
    try:
        wheels = probe_wheel(s.ws.root / "wheels").parent
        box = toolbox(s, BY_KEY["experiments"])
        out = box.call("bash", {"command": (
            f"python3 -m venv .venv && .venv/bin/pip install --no-index --find-links {wheels} labrun-probe -q && "
            ".venv/bin/python -c 'import labrun_probe; print(\"pip:\", labrun_probe.VALUE)' && "
            f"{uv()} venv -q .uvenv && {uv()} pip install -q --python .uvenv/bin/python --no-index "
            f"--find-links {wheels} labrun-probe && "
            ".uvenv/bin/python -c 'import labrun_probe; print(\"uv:\", labrun_probe.VALUE)'; echo HOME=$HOME")}).content
        assert "pip: 42" in out and "uv: 42" in out, out
        cache = s.ws.data / "cache"
        assert f"HOME={cache / 'home'}" in out
        assert any((cache / "uv").iterdir()), "uv wrote its cache elsewhere"
    finally:
        s.close()


PLANTED = (".bashrc", ".profile", ".cache/huggingface/token", ".huggingface/token", ".kaggle/kaggle.json",
           ".git-credentials", ".config/git/credentials", ".somethingnew/secret")
"""Where tools keep keys in a home: none of them on a list of the sandbox's (the last one on no list at all)."""


@pytest.fixture
def home(monkeypatch):
    """A user's home with a secret in each of `PLANTED`, and HOME pointing at it. Outside /tmp,
    whose paths the sandbox's private /tmp hides anyway."""
    home = Path("/var/tmp") / f"labrun-home-{uuid.uuid4().hex}"
    for name in PLANTED:
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(f"export LEAKED_KEY=planted-{uuid.uuid4().hex}\n")
    monkeypatch.setenv("HOME", str(home))
    assert Path.home() == home
    try:
        yield home
    finally:
        shutil.rmtree(home)


def test_no_file_of_a_home_is_readable_whatever_its_name_and_a_workspace_in_it_works(home, monkeypatch):
    secrets = {name: (home / name).read_text().split("=")[1].strip() for name in PLANTED}
    s = Session.open(home / "research" / "ws", DEMO_IDEA, "scripted")
    try:
        box = toolbox(s, BY_KEY["experiments"])
        attack = (f"cat {' '.join(str(home / name) for name in PLANTED)}; grep -rsh planted- {home}; "
                  "echo SHADOW $(grep -c ^root: /etc/shadow)")
        with monkeypatch.context() as weak:  # the sandbox as it was: the homes shown but for a list of stores
            weak.setattr(sandbox, "hidden_paths", lambda: [])
            shown = box.call("bash", {"command": attack}).content
        assert all(secret in shown for secret in secrets.values()), shown
        assert ("SHADOW 1" in shown) == (os.geteuid() == 0), shown  # root reads its own files, capabilities or not

        out = box.call("bash", {"command": attack}).content
        assert not [name for name, secret in secrets.items() if secret in out], out
        assert "planted-" not in out and "SHADOW 1" not in out, out

        # The workspace, though in the home, is the command's: writable, its .labrun/ read-only.
        wheels = probe_wheel(s.ws.root / "wheels").parent
        out = box.call("bash", {"command": (
            "echo kept > made.txt; touch .labrun/escaped.txt; "
            f"python3 -m venv .venv && .venv/bin/pip install --no-index --find-links {wheels} labrun-probe -q && "
            ".venv/bin/python -c 'import labrun_probe; print(\"pip:\", labrun_probe.VALUE)'")}).content
        assert "pip: 42" in out, out
        assert (s.ws.root / "made.txt").read_text() == "kept\n"
        assert not (s.ws.data / "escaped.txt").exists()
    finally:
        s.close()


@pytest.fixture
def test_host(tmp_path):
    """A test host of its own (tests/web_host.py) with a package index holding `labrun-probe`."""
    index = tmp_path / "index"
    wheel = probe_wheel(index / "wheels")
    (index / "simple" / "labrun-probe").mkdir(parents=True)
    (index / "simple" / "labrun-probe" / "index.html").write_text(
        f'<a href="/wheels/{wheel.name}">{wheel.name}</a>\n')
    (index / "hello.txt").write_text("hello from the test host\n")
    with serving(index, "hello.txt") as url:
        yield url


def test_egress_goes_through_the_proxy_to_the_internet_and_no_network_means_none(tmp_path, test_host):
    s = Session.open(tmp_path / "ws", DEMO_IDEA, "scripted")
    try:
        box = toolbox(s, BY_KEY["experiments"])
        out = box.call("bash", {"command": (
            f"curl -sS {test_host}/hello.txt; curl -sS --proxytunnel {test_host}/hello.txt; "  # plain, and CONNECT
            f"python3 -m venv .venv && .venv/bin/pip install -q --isolated --index-url {test_host}/simple/ "
            f"--trusted-host {test_host.split('//')[1].split(':')[0]} labrun-probe && .venv/bin/python -c 'import labrun_probe; print(\"installed\", labrun_probe.VALUE)'")}
        ).content
        assert out.count("hello from the test host") == 2 and "installed 42" in out, out
    finally:
        s.close()
    offline = Session.open(tmp_path / "ws", network=False)  # labrun resume --no-network
    try:
        out = toolbox(offline, BY_KEY["experiments"]).call(
            "bash", {"command": f"curl -sS -m 5 {test_host}/hello.txt; env | grep -i proxy; echo count=$(env | grep -ci _proxy=)"}).content
        assert "hello from the test host" not in out and "count=0" in out, out
        assert "without network" in (tmp_path / "ws" / "STATE.md").read_text()  # the Worklog says so
    finally:
        offline.close()


@pytest.mark.parametrize("constraint", [{"allowed_domains": ["pypi.org", "files.pythonhosted.org"]},
                                        {"network": False}])
def test_an_idea_can_narrow_egress_to_its_domains_or_turn_it_off(tmp_path, test_host, constraint):
    idea = yaml.safe_load(DEMO_IDEA.read_text())
    idea["idea"]["constraints"].update(constraint)
    path = tmp_path / "narrow.yaml"
    path.write_text(yaml.safe_dump(idea))
    s = Session.open(tmp_path / "ws", path, "scripted")
    try:
        out = toolbox(s, BY_KEY["experiments"]).call("bash", {"command": f"curl -sS -m 5 {test_host}/hello.txt"}).content
        assert "hello from the test host" not in out
        if "allowed_domains" in constraint:
            assert "is not among this session's allowed domains (pypi.org, files.pythonhosted.org)" in out, out
    finally:
        s.close()


ENGINE = """
import sys, time
from labrun.session import Session
s = Session.open(sys.argv[1], sys.argv[2], "scripted")
sandbox = s.confinement.sandbox()
print(s.confinement._egress.proc.pid, sandbox.egress, flush=True)
time.sleep(600)
"""


def test_the_egress_proxy_ends_with_its_engine_however_it_ends(tmp_path):
    """A `kill -9` of the engine leaves neither the proxy's processes nor its folder."""
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(tmp_path / "ws"), str(DEMO_IDEA)],
                              stdout=subprocess.PIPE, text=True)
    pid, sock = engine.stdout.readline().split()
    proxy = psutil.Process(int(pid))
    # proxy.py forks its acceptor just after it binds the socket
    wait_for(lambda: proxy.children(recursive=True), timeout=10, what="the proxy's acceptor")
    family = [proxy, *proxy.children(recursive=True)]
    assert Path(sock).exists()
    engine.kill()
    engine.wait()

    def gone(p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    wait_for(lambda: all(map(gone, family)) and not Path(sock).parent.exists(), timeout=10,
             what="the egress proxy and its folder to go with the engine")
