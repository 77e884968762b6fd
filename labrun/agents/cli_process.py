"""A coding CLI's process as labrun talks to it: the environment it starts with, what its
`--version` says, the prompt on its stdin, and its stdout's events into the run's transcript
and the engine's inbox. What ties it to the engine (namespaces, the parent-death signal,
killing its tree) is containment: `labrun.sandbox`."""

from __future__ import annotations

import json
import os
import queue
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from labrun.secrets import redact
from labrun.settings import settings

ALWAYS_PASSED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
                 "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
                 "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                 "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")


def passed_env(names: Iterable[str] = (), prefixes: Iterable[str] = (), drop: Iterable[str] = ()) -> dict[str, str]:
    """The environment a CLI run gets: what any program needs to run here (paths, locale,
    proxies, certificates), the `names` and `prefixes` the CLI itself needs, and whatever
    LABRUN_PASS_ENV names; nothing else, and nothing in `drop`."""
    extra = {n.strip() for n in settings().pass_env.split(",") if n.strip()}
    wanted, prefixes, drop = set(ALWAYS_PASSED) | set(names) | extra, tuple(prefixes), set(drop)
    return {k: v for k, v in os.environ.items()
            if k not in drop and (k in wanted or k.startswith("LC_") or k.startswith(prefixes))}


@lru_cache(maxsize=8)
def version(executable: str) -> str:
    """What the CLI's `--version` says ("" when it says nothing)."""
    try:
        said = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        said = ""
    return said.strip()


def feed_stdin(proc: subprocess.Popen, prompt: str) -> None:
    try:
        proc.stdin.write(prompt.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def read_stdout(proc: subprocess.Popen, transcript: Path, inbox: queue.Queue) -> None:
    """Every line of the stream into the transcript (redacted) and, parsed, to the engine."""
    with open(transcript, "a", encoding="utf-8") as f:
        for raw in proc.stdout:
            line = redact(raw.decode(errors="replace").rstrip("\r\n"))
            if not line.strip():
                continue
            try:
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError
            except ValueError:
                event = {"type": "labrun", "event": "not-json", "text": line[:2000]}
                line = json.dumps(event, ensure_ascii=False)
            f.write(line + "\n")
            f.flush()
            inbox.put(("event", event))
        os.fsync(f.fileno())
    inbox.put(("eof", None))
