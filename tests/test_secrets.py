"""Redaction is exact: every secret goes, and no ordinary word or file name is touched."""

from __future__ import annotations

import os
import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.utils.conventions import not_set

from labrun.secrets import REDACTED, WORD_SAFE_CHARS, redact, scrubbed_env

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

