"""Keep secrets out of everything labrun writes: STATE.md, logs, transcripts, artifacts."""

from __future__ import annotations

import os
import re
from typing import Any

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)
# Strings shaped like a credential even when no variable holds them.
SECRET_SHAPES = re.compile(
    r"sk-ant-[A-Za-z0-9_\-]{8,}"
    r"|sk-[A-Za-z0-9_\-]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|AKIA[0-9A-Z]{16}"
    r"|xox[abpr]-[A-Za-z0-9\-]{10,}"
    r"|hf_[A-Za-z0-9]{20,}"
)
REDACTED = "[REDACTED]"


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names say they hold a secret."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= 8}
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    for value in secret_values():
        text = text.replace(value, REDACTED)
    return SECRET_SHAPES.sub(REDACTED, text)


def redact_data(data: Any) -> Any:
    """`redact` applied to every string in JSON-like data."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, list):
        return [redact_data(v) for v in data]
    if isinstance(data, dict):
        return {k: redact_data(v) for k, v in data.items()}
    return data


def scrubbed_env() -> dict[str, str]:
    """The environment for agent commands: no secrets, except those the user passes on by
    name in LABRUN_PASS_ENV (comma-separated) because the idea needs them."""
    allow = {n.strip() for n in os.environ.get("LABRUN_PASS_ENV", "").split(",") if n.strip()}
    return {k: v for k, v in os.environ.items() if k in allow or not SECRET_NAME.search(k)}
