"""Keep secrets out of everything labrun writes: STATE.md, logs, transcripts, artifacts.

Two rules, both exact enough never to touch an ordinary word or file name: the values of
the environment's secret variables (a name with a part such as KEY, TOKEN or PASSWORD, or a
name `declare`d secret: the keys a session's experiments are given), as they are and in the
encodings a command prints them in (`ENCODINGS`), and strings in the shape of a credential
with a known prefix, standing as a word of their own.
"""

from __future__ import annotations

import base64
import json
import os
import re
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

from labrun.settings import settings

# Name parts (split on _ - .) that say a variable holds a secret: GITHUB_TOKEN, DB_PASSWORD,
# AWS_SECRET_ACCESS_KEY; never GIT_AUTHOR_NAME, TOKENIZERS_PARALLELISM or KEYBOARD.
SECRET_PARTS = {"KEY", "KEYS", "APIKEY", "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD",
                "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "AUTH", "PAT", "PASS", "PWD", "PW",
                "JWT", "WEBHOOK"}
NOT_SECRET_NAMES = {"PWD", "OLDPWD"}
"""The shell's working folders, whatever their parts say."""
SECRET_SUFFIXES = ("PASSWORD", "PASSWD", "TOKEN", "SECRET", "APIKEY")  # PGPASSWORD, ACCESSTOKEN
MIN_SECRET_CHARS = 8
WORD_SAFE_CHARS = 16
"""An environment secret shorter than this is redacted only where it stands as a word."""

_START = r"(?<![A-Za-z0-9])"  # a token begins a word: "task-specific" holds no "sk-"
_END = r"(?![A-Za-z0-9])"
SECRET_SHAPES = re.compile(
    _START + "(?:"
    r"sk-ant-[a-z]{2,10}\d{2}-[A-Za-z0-9_\-]{16,}"  # Anthropic: sk-ant-api03-…, sk-ant-admin01-…
    r"|sk-(?:proj|svcacct|admin)-[A-Za-z0-9_\-]{20,}"  # OpenAI project and service keys
    r"|sk-[A-Za-z0-9]{40,}" + _END +  # OpenAI's older keys: 48 letters and digits, no dashes
    r"|gh[pousr]_[A-Za-z0-9]{36}" + _END +  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{50,}"
    r"|hf_[A-Za-z]{34}" + _END +  # Hugging Face
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}" + _END +  # AWS access key ids
    r"|xox[abposr]-(?:\d+-){2,3}[A-Za-z0-9]{24,}" + _END +  # Slack: numeric ids, then the secret
    r"|AIza[0-9A-Za-z_\-]{30,40}" + _END +  # Google API keys
    r"|(?:sk|rk)_live_[0-9A-Za-z]{20,}" + _END +  # Stripe
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # a JSON web token
    r"|https://hooks\.slack\.com/services/[A-Za-z0-9/]{20,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
    ")"
)
SECRET_SETTINGS = re.compile(
    r"(?i)(?:^|[;&?\s])(?:password|passwd|pwd|accountkey|sharedaccesskey|secret)=[^;&\s]"  # a connection string, a query
    r"|authorization:\s*(?:basic|bearer|token)\s+\S{8,}"  # a header kept in a variable (git's extraheader in CI)
    r"|[a-z][a-z0-9+.\-]*://[A-Za-z0-9_\-]{16,}@"  # a token as a URL's user name (Gemfury, GitLab)
    r"|[a-z][a-z0-9+.\-]*://[^/\s:@]*:[^/\s@]+@"  # a URL with a password (`postgres://app:pw@db`)
)
"""A value that carries a secret as a setting, whatever the variable is called."""
REDACTED = "[REDACTED]"
declared: set[str] = set()
"""Variables whose values are secrets whatever their names (`declare`)."""


@lru_cache(maxsize=4096)
def is_secret_value(value: str) -> bool:
    """A value that holds a secret whatever its variable is called: a token of a known shape,
    or a secret kept as a setting (a URL's password, a connection string's)."""
    return bool(SECRET_SHAPES.search(value) or SECRET_SETTINGS.search(value))


@lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    if name in NOT_SECRET_NAMES:
        return False
    parts = re.split(r"[_\-.]", name.upper())
    return any(p in SECRET_PARTS or p.endswith(SECRET_SUFFIXES) for p in parts)


def undumpable() -> None:
    """No process of the same user may read this one's environment or memory
    (`/proc/PID/environ`, `mem`, `fd`) or attach to it: it holds keys, and the agent's commands
    and a coding CLI's own shell run as the same user (root, or CAP_SYS_PTRACE, still could)."""
    import ctypes

    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def declare(names: Iterable[str]) -> None:
    """Redact these variables' values from now on, whatever their names: a key passed to
    the experiments may be called anything (SERVICE_ACCESS, OPENAI_ORG)."""
    declared.update(names)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of the environment's secret variables, longest first. A value that names an
    existing absolute path (SSH_AUTH_SOCK, a key file's location) is a place, not a secret."""
    env = os.environ if environ is None else environ
    values = {
        form for k, v in env.items()
        if k in declared or is_secret_name(k) or is_secret_value(v)
        for form in (v, v.strip())  # a value read from a CRLF file ends in "\r"; a program strips it
        if len(form) >= MIN_SECRET_CHARS and not (os.path.isabs(form) and os.path.exists(form))
    }
    return sorted(values, key=len, reverse=True)


Form = tuple[str, bool]
"""A regular expression for one way a value is printed, and whether a short value's match
must stand as a word (what is cut from a longer encoding, such as base64, cannot)."""

_WRAP = r"(?:\r?\n)?"  # base64, openssl and xxd -p wrap their output at 60 to 76 characters


def _wrapped(encoded: str) -> str:
    return _WRAP.join(re.escape(c) for c in encoded)


def literal(value: str) -> list[Form]:
    return [(re.escape(value), True)]


def backwards(value: str) -> list[Form]:
    return [(re.escape(value[::-1]), True)]


def escaped(value: str) -> list[Form]:
    """As a URL (percent-encoded, fully or in part, a space also as '+') or a JSON string
    holds it: each character in any of its spellings, letters and digits too (an encoder
    may escape every byte: `%61%62`, `\\u0061`)."""
    chars = []
    for c in value:
        spellings = [re.escape(c), "(?i:" + "".join(f"%{b:02x}" for b in c.encode()) + ")"]
        if c == " ":
            spellings.append(r"\+")
        if json.dumps(c)[1:-1] != c:
            spellings.append("(?i:" + re.escape(json.dumps(c)[1:-1]) + ")")
        if c == "/":
            spellings.append(re.escape("\\/"))  # JSON's other spelling of it (PHP writes it so)
        if ord(c) < 0x10000:
            spellings.append(f"(?i:\\\\u{ord(c):04x})")
        chars.append("(?:" + "|".join(dict.fromkeys(spellings)) + ")")
    return [("".join(chars), True)]


def in_hex(value: str) -> list[Form]:
    """Its UTF-8 bytes in hex, either case, wrapped or not."""
    return [("(?i:" + _wrapped(value.encode().hex()) + ")", False)]


def in_base64(value: str) -> list[Form]:
    """Base64, standard or URL-safe, padded or not, wrapped or not, alone or inside the
    base64 of a longer string. Such a string puts the value at one of three offsets in its
    3-byte groups; at each, the characters that hold only the value's bits are the same
    whatever surrounds it. Those are matched; the one at each end that also holds a
    neighbour's bits is not (it is left, telling little)."""
    data = value.encode()
    forms = []
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + data).decode()
        first = -(-8 * offset // 6)  # the first 6-bit group that starts in the value
        last = 8 * (offset + len(data)) // 6  # the end of the last one that ends in it
        core = encoded[first:last]
        for spelling in {core, core.translate(str.maketrans("+/", "-_"))}:
            forms.append((_wrapped(spelling), False))
    return forms


ENCODINGS: tuple[Callable[[str], list[Form]], ...] = (literal, escaped, backwards, in_hex, in_base64)
"""Each a way a value may be printed (`print(key[::-1])`, `base64 <<< $KEY`); all are redacted."""


@lru_cache(maxsize=16)
def _values_pattern(values: tuple[str, ...],
                    encodings: tuple[Callable[[str], list[Form]], ...]) -> re.Pattern[str] | None:
    """One pattern for every form of every value, compiled once per set of values: redact
    runs on every tool result and log line. Longer forms come first, so that where two start
    at the same place the longer one is cut."""
    forms = {(pattern, word and len(value) < WORD_SAFE_CHARS)
             for value in values for encoding in encodings for pattern, word in encoding(value)}
    if not forms:
        return None
    alternatives = [_START + pattern + _END if word else pattern
                    for pattern, word in sorted(forms, key=lambda f: len(f[0]), reverse=True)]
    return re.compile("|".join(alternatives))


def _redactor() -> Callable[[str], str]:
    """`redact` for the environment's secrets as they are now."""
    values = _values_pattern(tuple(secret_values()), ENCODINGS)

    def redact_text(text: str) -> str:
        if values is not None:
            text = values.sub(REDACTED, text)
        return SECRET_SHAPES.sub(REDACTED, text)
    return redact_text


def redact(text: str) -> str:
    return _redactor()(text)


def redact_bytes(data: bytes) -> bytes:
    """`redact` on a file's bytes, whatever they hold: UTF-8 text, or not (an image's text
    chunk, a pickle, one stray byte). Bytes that are not UTF-8 pass as themselves
    (surrogateescape), so the file is the same but for what is cut."""
    return redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def redact_data(data: Any) -> Any:
    """`redact` applied to every string in JSON-like data (the secrets looked up once)."""
    return _redact_each(data, _redactor())


def _redact_each(data: Any, redact_text: Callable[[str], str]) -> Any:
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, list):
        return [_redact_each(v, redact_text) for v in data]
    if isinstance(data, dict):  # keys too: a file's name may hold a key
        return {redact_text(k) if isinstance(k, str) else k: _redact_each(v, redact_text) for k, v in data.items()}
    return data


ENGINE_PREFIXES = ("PREFECT_", "LABRUN_")
"""Variables that name the engine's side (its Prefect API, its MCP server's token, its settings)."""


def scrubbed_env(keys: Iterable[str] = ()) -> dict[str, str]:
    """The environment for agent commands: no secrets and nothing of the engine's, except
    `keys` (the ones a session's experiments are given, `labrun.keys`) and those named in
    LABRUN_PASS_ENV (comma-separated)."""
    allow = {n.strip() for n in settings().pass_env.split(",") if n.strip()} | set(keys)
    return {k: v for k, v in os.environ.items()
            if k in allow or not (k in declared or is_secret_name(k) or is_secret_value(v)
                                  or k.startswith(ENGINE_PREFIXES))}
