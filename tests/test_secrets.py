"""Redaction is exact: every secret goes, and no ordinary word or file name is touched."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import string
import textwrap
import time
import urllib.parse
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.utils.conventions import not_set

from labrun import secrets
from labrun.secrets import MIN_SECRET_CHARS, REDACTED, WORD_SAFE_CHARS, redact, scrubbed_env

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck),
                derandomize=bool(os.environ.get("CI")), database=None if os.environ.get("CI") else not_set)

# Words of research prose and file names, with every prefix a token shape starts with, and
# the words that hold them ("task", "risk", "desk", "ghost", "hf" ...).
WORDS = """task specific fine tuning risk ask desk disk sk ant proj svcacct admin hf ghp gho ghs xoxb
xoxp akia asia github pat key keys token tokenizer secret password auth author api config configs
results data dataset model models checkpoint run runs seed baseline ablation eval train test val
learning rate batch size loss accuracy figure table appendix method hypothesis experiment analysis
planning setup implementation documentation bert base uncased llama lora qlora adapter embedding
attention transformer skip sketch skew ski skill skeleton antibody antenna project projection
huggingface hub dataset_card monkey keyboard keystone tokens_per_second passwordless""".split()
SEPARATORS = ["-", "_", "/", ".", " ", "", ":", "="]


def identifier():
    """Ids that appear in real output: hex digests, run ids, version strings, numbers."""
    return st.one_of(
        st.text("0123456789abcdef", min_size=7, max_size=40),
        st.integers(0, 10**12).map(str),
        st.builds(lambda a, b, c: f"v{a}.{b}.{c}", st.integers(0, 20), st.integers(0, 99), st.integers(0, 9)),
        st.uuids().map(str),
    )


piece = st.one_of(st.sampled_from(WORDS), st.sampled_from(WORDS).map(str.upper),
                  st.sampled_from(WORDS).map(str.title), identifier())
name = st.lists(piece, min_size=1, max_size=6).flatmap(
    lambda parts: st.lists(st.sampled_from(SEPARATORS), min_size=len(parts) - 1, max_size=len(parts) - 1)
    .map(lambda seps: parts[0] + "".join(s + p for s, p in zip(seps, parts[1:]))))
path = st.builds(lambda dirs, file, ext: "/".join(dirs + [file]) + ext,
                 st.lists(name, max_size=4), name,
                 st.sampled_from(["", ".py", ".yaml", ".json", ".csv", ".md", ".ckpt", ".safetensors", ".log"]))
prose = st.lists(st.one_of(name, path), min_size=1, max_size=20).map(" ".join)

ENV_SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-api03-" + "Ab9_" * 20,
    "GITHUB_TOKEN": "ghp_" + "Zq81" * 9,
    "DB_PASSWORD": "plain-value-of-a-password-9f8e7d",
    "PGPASSWORD": "hunter2hunter2",
}
ORDINARY_ENV = {"GIT_AUTHOR_NAME": "Ada Lovelace Research Group", "GIT_AUTHOR_EMAIL": "ada@example.org",
                "TOKENIZERS_PARALLELISM": "false-false-false", "HF_HOME": "/tmp/huggingface-home-dir",
                "KEYBOARD_LAYOUT": "english-international", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    for k, v in {**ENV_SECRETS, **ORDINARY_ENV}.items():
        monkeypatch.setenv(k, v)


def test_the_issues_examples_are_left_alone():
    for text in ["configs/task-specific-fine-tuning.yaml", "ls: configs/task-specific-fine-tuning.yaml",
                 "results/risk-assessment-of-projection-heads.csv", "desk-sk-ant-colony-optimisation.md",
                 "Ada Lovelace Research Group", "GIT_AUTHOR_NAME=Ada Lovelace Research Group",
                 "hf_hub_download(repo_id='bert-base-uncased')", "skip-connections-with-layer-norm",
                 "TOKENIZERS_PARALLELISM=false-false-false"]:
        assert redact(text) == text


@FUZZ
@given(prose)
def test_no_realistic_path_or_prose_is_redacted(text):
    assert redact(text) == text


@FUZZ
@given(prose, st.sampled_from(sorted(ENV_SECRETS.values())), prose)
def test_an_environment_secret_is_redacted_wherever_it_stands(before, secret, after):
    if len(secret) >= WORD_SAFE_CHARS:  # a shorter one only where it stands as a word
        assert secret not in redact(before + secret + after)
    assert secret not in redact(f"{before} {secret} {after}")
    assert secret not in redact(f"{before}/{secret}.txt")


def _random(alphabet: str, n: int, rng: random.Random) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


@pytest.mark.parametrize("seed", range(20))
def test_every_known_token_shape_is_redacted(seed):
    rng = random.Random(seed)
    alnum = string.ascii_letters + string.digits
    tokens = [
        "sk-ant-api03-" + _random(alnum + "_-", 93, rng) + "AA",
        "sk-ant-admin01-" + _random(alnum + "_-", 40, rng),
        "sk-proj-" + _random(alnum + "_-", 120, rng),
        "sk-" + _random(alnum, 48, rng),
        "ghp_" + _random(alnum, 36, rng),
        "gho_" + _random(alnum, 36, rng),
        "github_pat_" + _random(alnum, 22, rng) + "_" + _random(alnum, 59, rng),
        "hf_" + _random(string.ascii_letters, 34, rng),
        "AKIA" + _random(string.ascii_uppercase + string.digits, 16, rng),
        "xoxb-" + _random(string.digits, 12, rng) + "-" + _random(string.digits, 13, rng) + "-" + _random(alnum, 24, rng),
    ]
    for token in tokens:
        for text in [token, f"key={token}", f"Authorization: Bearer {token}\n", f'{{"token": "{token}"}}',
                     f"export X='{token}'", f"/secrets/{token}.txt"]:
            out = redact(text)
            assert token not in out and REDACTED in out, text


def test_agent_commands_get_no_secret_variables_but_keep_ordinary_ones(monkeypatch):
    monkeypatch.setenv("LABRUN_PASS_ENV", "GITHUB_TOKEN")
    env = scrubbed_env()
    for name in ("ANTHROPIC_API_KEY", "DB_PASSWORD", "PGPASSWORD"):
        assert name not in env
    assert env["GITHUB_TOKEN"] == ENV_SECRETS["GITHUB_TOKEN"]  # passed on by name
    for name, value in ORDINARY_ENV.items():
        assert env[name] == value


def test_a_short_secret_is_redacted_as_a_word_only(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    assert redact("x-api-key: test-key") == f"x-api-key: {REDACTED}"
    assert redact("see latest-keyboard and test-keyring") == "see latest-keyboard and test-keyring"



# -- encodings: a command may print a key base64'd, in hex, URL-encoded, reversed -----------------

def literal_only(text: str) -> str:
    """The weak target: redaction of the values only as they are, as labrun had it."""
    with patch.object(secrets, "ENCODINGS", (secrets.literal,)):
        return redact(text)


def lower_escapes(url: str) -> str:
    return re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), url)


ODD_KEY = 'k3y/with+odd chars="é"&-0123456789abcdef-0123456789abcdef-0123456789'  # 70 bytes: base64 wraps
KEY_PRINTED = {  # how a command prints it, as `echo`, `base64`, `xxd -p`, Python or curl would
    "base64": base64.b64encode(ODD_KEY.encode()).decode(),
    "base64 of a line (echo | base64), wrapped at 76": base64.encodebytes(ODD_KEY.encode() + b"\n").decode(),
    "base64 after 1 byte": base64.b64encode(b":" + ODD_KEY.encode()).decode(),
    "base64 after 2 bytes, unpadded": base64.b64encode(b"u:" + ODD_KEY.encode()).decode().rstrip("="),
    "URL-safe base64": base64.urlsafe_b64encode(ODD_KEY.encode()).decode(),
    "URL-safe base64 after 1 byte, unpadded": base64.urlsafe_b64encode(b"=" + ODD_KEY.encode()).decode().rstrip("="),
    "hex": ODD_KEY.encode().hex(),
    "HEX": ODD_KEY.encode().hex().upper(),
    "hex wrapped at 60 (xxd -p)": "\n".join(textwrap.wrap(ODD_KEY.encode().hex(), 60)),
    "percent-encoded": urllib.parse.quote(ODD_KEY, safe=""),
    "percent-encoded, lower case": lower_escapes(urllib.parse.quote(ODD_KEY, safe="")),
    "form-encoded": urllib.parse.quote_plus(ODD_KEY),
    "a URL's path": urllib.parse.quote(ODD_KEY),
    "a JSON string": json.dumps(ODD_KEY),
    "reversed": ODD_KEY[::-1],
}


@pytest.mark.parametrize("encoded", KEY_PRINTED.values(), ids=KEY_PRINTED.keys())
def test_a_key_printed_encoded_is_redacted(monkeypatch, encoded):
    monkeypatch.setenv("STUDY_API_KEY", ODD_KEY)
    printed = f"the key: {encoded}\nloss 0.25\n"
    assert literal_only(printed) == printed  # the attack: literal redaction lets it through
    out = redact(printed)
    assert out.startswith("the key: ") and out.endswith("loss 0.25\n")
    left = out.removeprefix("the key: ").removesuffix("loss 0.25\n").strip().split(REDACTED)
    # Of the encoding, at most the characters at each end that also hold a neighbour's bits
    # (echo's newline, base64's padding) are left.
    assert len(left) == 2 and all(len(side) <= 4 for side in left), out


def _b64_core(data: bytes, before: bytes) -> str:
    """Of the base64 of `before + data + ...`, the characters that hold only `data`'s bits."""
    encoded = base64.b64encode(before + data).decode()
    return encoded[-(-8 * len(before) // 6):8 * (len(before) + len(data)) // 6]


@FUZZ
@given(st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0[]"),
               min_size=MIN_SECRET_CHARS, max_size=80),  # no brackets: "[REDACTED]" and what follows it never spell one
       st.text(max_size=40), st.text(max_size=40), st.binary(max_size=7), st.binary(max_size=7))
def test_every_covered_encoding_of_a_secret_is_redacted_wherever_it_stands(secret, before, after, head, tail):
    assume(not os.path.exists(secret))  # a path is not taken for a secret
    data = secret.encode()
    words = [secret, secret[::-1], urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret),
             lower_escapes(urllib.parse.quote(secret, safe="")), json.dumps(secret)[1:-1]]
    printed = [(f"{before} {word} {after}", word) for word in words]  # a short one is redacted as a word
    for case in (str.lower, str.upper):
        printed.append((before + case((head + data + tail).hex()) + after, case(data.hex())))
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        core = _b64_core(data, head)
        if encode is base64.urlsafe_b64encode:
            core = core.translate(str.maketrans("+/", "-_"))
        encoded = encode(head + data + tail).decode()
        printed += [(before + encoded + after, core), (before + encoded.rstrip("=") + after, core)]
    wrapped = before + base64.encodebytes(head + data + tail).decode() + after  # lines of 76
    with patch.dict(os.environ, {"FUZZ_API_KEY": secret}):
        for text, encoded in printed:
            assert encoded not in redact(text), text
        assert _b64_core(data, head) not in redact(wrapped).replace("\n", ""), wrapped


def test_a_value_too_short_to_be_a_secret_is_left_in_every_encoding(monkeypatch):
    short = "x" * (MIN_SECRET_CHARS - 1)
    monkeypatch.setenv("SHORT_API_KEY", short)
    for text in (short, short.encode().hex(), base64.b64encode(short.encode()).decode(), f"a {short} b"):
        assert redact(text) == text


def test_a_megabyte_is_redacted_in_well_under_a_second(monkeypatch):
    """redact runs on every tool result and log; its pattern is compiled once per set of values."""
    monkeypatch.setenv("STUDY_API_KEY", ODD_KEY)
    rng = random.Random(0)
    lines = ["epoch 3 loss 0.2513 acc 0.914", "results/run-3/metrics.json written", "Traceback (most recent call last):",
             base64.b64encode(rng.randbytes(57)).decode(), rng.randbytes(30).hex()]
    text = "\n".join(rng.choice(lines) for _ in range(30_000))[:1_000_000]
    redact(text)  # the pattern compiled
    start = time.perf_counter()
    assert redact(text) == text
    assert time.perf_counter() - start < 1.0  # about 0.1 s on one core of a laptop


def test_an_engine_holding_keys_is_not_dumpable(tmp_path):
    """The agent's commands and a coding CLI's shell run as the engine's user: a dumpable
    engine's /proc/PID/environ (its keys) and memory are theirs to read. Shown dumpable
    before the session opens."""
    import subprocess
    import sys

    from support import DEMO_IDEA

    probe = ("import ctypes, sys\nfrom labrun.session import Session\n"
             "dumpable = lambda: ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)\n"
             "before = dumpable()\ns = Session.open(sys.argv[1], sys.argv[2], 'scripted')\n"
             "print(before, dumpable())\ns.close()\n")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "ws"), str(DEMO_IDEA)],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", "0"], done.stderr
