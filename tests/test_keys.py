"""Keys for experiments: the variables an idea names (`constraints.api_keys`) and those given
with `--pass-env` reach the commands of `run_experiment` and `bash`, inside the sandbox, and
nothing else; their values are redacted from everything written; a resume keeps them; and
`labrun check` says when an idea seems to need a key it does not name."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from auto_responder import IDEA, AutoResearcher, _call  # noqa: E402
from support import DEMO_IDEA, labrun  # noqa: E402
from test_anthropic_session import BAD_REQUEST  # noqa: E402

from labrun.keys import check_warnings  # noqa: E402
from labrun.idea import parse_idea  # noqa: E402
from labrun.secrets import REDACTED, declare, redact, scrubbed_env  # noqa: E402
from labrun.status import session_status  # noqa: E402

STUDY_KEY = "study-key-4d1c9e0b7a6f5e3d2c1b0a99"  # named by the idea (a name that says "key")
ACCESS = "access-8f7e6d5c4b3a29180716aa"  # passed with --pass-env (a name that says nothing)
NOT_PASSED = "ghp_" + "N0tPassedN0tPassedN0tPassedN0tPass3d"  # in the engine's environment only
NAMES = ("STUDY_API_KEY", "SERVICE_ACCESS", "OTHER_GITHUB_TOKEN")
PROBE = f'''"""What a command of this session sees of the keys: a digest of each, and each printed,
as it is and encoded."""
import base64, hashlib, json, os, sys
names = {list(NAMES)!r}
os.makedirs("results", exist_ok=True)
seen = {{n: hashlib.sha256(os.environ[n].encode()).hexdigest() if n in os.environ else None for n in names}}
json.dump(seen, open(f"results/keys-{{sys.argv[1]}}.json", "w"))
for n in names:
    print(n, "=", os.environ.get(n, "(unset)"))
    value = os.environ.get(n, "").encode()
    print(n, "in hex =", value.hex(), "in base64 =", base64.b64encode(value).decode())
'''


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def printed(value: str) -> list[str]:
    """The value and its encodings as the probe prints them (base64 less its last, mixed
    character and padding)."""
    return [value, value.encode().hex(), base64.b64encode(value.encode()).decode()[:-3]]


class KeyProber(AutoResearcher):
    """The usual researcher, whose setup `bash` call and experiment command also run the probe."""

    def setup(self, body, turn):
        say, calls = super().setup(body, turn)
        if turn == 1:
            calls = [_call("str_replace_based_edit_tool", command="create", path="probe.py", file_text=PROBE),
                     _call("bash", command=calls[0][1]["command"] + " && python3 probe.py bash")]
        return say, calls

    def experiments(self, body, turn):
        say, calls = super().experiments(body, turn)
        return say, [(name, {**inp, "command": "python3 probe.py experiment && " + inp["command"]})
                     if name == "run_experiment" else (name, inp) for name, inp in calls]


def test_keys_reach_the_experiments_commands_only_and_a_resume_keeps_them(tmp_path, serve, cli, monkeypatch):
    from prefect.client.orchestration import get_client

    idea = tmp_path / "idea.yaml"
    idea.write_text(IDEA + "    api_keys: [STUDY_API_KEY]\n")
    monkeypatch.setenv("STUDY_API_KEY", STUDY_KEY)
    monkeypatch.setenv("SERVICE_ACCESS", ACCESS)
    monkeypatch.setenv("OTHER_GITHUB_TOKEN", NOT_PASSED)
    api = serve(KeyProber({("implementation", 1): [BAD_REQUEST, BAD_REQUEST]}))
    ws = tmp_path / "ws"

    # Stopped in implementation (a 400), after setup's bash ran the probe.
    first = cli("run", str(idea), "--workspace", str(ws), "--agent", "anthropic", "--pass-env", "SERVICE_ACCESS")
    assert first.returncode == 1, first.stderr
    assert json.loads((ws / ".labrun/state.json").read_text())["pass_env"] == ["SERVICE_ACCESS"]

    # A resume where a key the session keeps is not set: one line says so, and it goes on.
    monkeypatch.delenv("SERVICE_ACCESS")
    second = cli("resume", str(ws))
    assert second.returncode == 1, second.stderr
    said = [line for line in second.stderr.splitlines() if "SERVICE_ACCESS" in line]
    assert len(said) == 1 and "not set in this environment: SERVICE_ACCESS (--pass-env)" in said[0], second.stderr
    assert "STUDY_API_KEY" not in second.stderr

    # The next resume, with the key set again and no --pass-env: the session still passes it on.
    monkeypatch.setenv("SERVICE_ACCESS", ACCESS)
    third = cli("resume", str(ws))
    assert third.returncode == 0, third.stderr
    assert "not set in this environment" not in third.stderr
    assert session_status(ws)["session"]["complete"]

    # Both keys reached bash's command and the experiment's, in the sandbox; the rest did not.
    expected = {"STUDY_API_KEY": digest(STUDY_KEY), "SERVICE_ACCESS": digest(ACCESS), "OTHER_GITHUB_TOKEN": None}
    for who in ("bash", "experiment"):
        assert json.loads((ws / f"results/keys-{who}.json").read_text()) == expected, who

    # The printed values were redacted from the output the model read...
    sent = json.dumps([r["body"] for r in api.requests])
    assert f"STUDY_API_KEY = {REDACTED}" in sent and f"SERVICE_ACCESS = {REDACTED}" in sent
    assert f"STUDY_API_KEY in hex = {REDACTED} in base64 = {REDACTED}" in sent
    assert "OTHER_GITHUB_TOKEN = (unset)" in sent
    # ...and the model was told which keys the runs have, by name.
    planning = next(r["body"] for r in api.requests if "# Phase 1 of 6: planning" in r["body"]["system"][0]["text"])
    assert "**Keys for the experiments:** `STUDY_API_KEY`, `SERVICE_ACCESS` are set" in planning["system"][0]["text"]
    # No value is in anything written: the requests, STATE.md, the journals, logs, attempt
    # logs, the terminal, Prefect's logs and artifacts.
    with get_client(sync_client=True) as client:
        prefect = json.dumps([l.message for l in client.read_logs()] +
                             [a.data for a in client.read_artifacts()], default=str)
    written = [p.read_text(errors="replace") for p in [ws / "STATE.md", *ws.rglob("*")] if p.is_file()]
    assert any(REDACTED in text for text in written)
    for value in [form for key in (STUDY_KEY, ACCESS, NOT_PASSED) for form in printed(key)]:
        assert value not in sent and value not in prefect
        assert not [t for t in written if value in t]
        assert all(value not in r.stdout + r.stderr for r in (first, second, third))


def test_pass_env_is_refused_in_one_line_when_bad_or_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_EXPORTED_KEY", raising=False)
    ws = tmp_path / "ws"
    for args, said in ((("--pass-env", "NOT_EXPORTED_KEY"), "--pass-env NOT_EXPORTED_KEY: not set in this environment"),
                       (("--pass-env", "BAD NAME"), "--pass-env: 'BAD NAME' is not an environment variable's name")):
        result = labrun("run", str(DEMO_IDEA), "--workspace", str(ws), "--agent", "scripted", *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().count("\n") == 0 and said in result.stderr, result.stderr
        assert not ws.exists()  # nothing started, nothing written


def test_keys_are_passed_only_to_the_commands_and_redacted_whatever_their_name(monkeypatch):
    from labrun import secrets

    monkeypatch.setattr(secrets, "declared", set())
    plain = "plain-setting-5a4b3c2d1e0f"
    monkeypatch.setenv("LAB_SERVICE_SETTING", plain)
    monkeypatch.setenv("STUDY_API_KEY", STUDY_KEY)
    assert "STUDY_API_KEY" not in scrubbed_env() and scrubbed_env(["STUDY_API_KEY"])["STUDY_API_KEY"] == STUDY_KEY
    assert redact(f"got {plain}") == f"got {plain}"  # an ordinary name: an ordinary value until declared
    declare(["LAB_SERVICE_SETTING"])
    assert redact(f"got {plain}") == f"got {REDACTED}"
    assert redact(f"got {plain.encode().hex()}") == f"got {REDACTED}"  # and as a command may print it
    assert "LAB_SERVICE_SETTING" not in scrubbed_env()  # a declared secret: only where it is passed
    assert scrubbed_env(["LAB_SERVICE_SETTING"])["LAB_SERVICE_SETTING"] == plain


def test_the_coding_clis_own_process_gets_no_experiment_key(monkeypatch, tmp_path):
    from labrun import secrets
    from labrun.agents.backends import make_agent
    from test_claude_code import ONLY_FAKE, plan_for

    monkeypatch.setenv("PATH", ONLY_FAKE)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("STUDY_API_KEY", STUDY_KEY)
    monkeypatch.setenv("SERVICE_ACCESS", ACCESS)
    monkeypatch.setattr(secrets, "declared", {"STUDY_API_KEY", "SERVICE_ACCESS"})  # as a session with these keys has
    env = make_agent("claude-code").environment(plan_for(tmp_path))
    assert "STUDY_API_KEY" not in env and "SERVICE_ACCESS" not in env
    assert STUDY_KEY not in env.values() and ACCESS not in env.values()


# -- labrun check -------------------------------------------------------------------------------

LLM_IDEA = """\
idea:
  title: "Does chain of thought help GPT-4 on grade-school maths?"
  domain: artificial_intelligence
  hypothesis: "Chain-of-thought prompting raises GPT-4's accuracy on GSM8K by five points."
"""


@pytest.mark.parametrize("keys, environ, warned", [
    ("", {}, "constraints.api_keys: none named, but the idea seems to call an API (it mentions GPT-4)"),
    ("  constraints:\n    api_keys: []\n", {}, None),  # says that its runs need none
    ("  constraints:\n    api_keys: [OPENAI_API_KEY]\n", {}, "constraints.api_keys: OPENAI_API_KEY is not set"),
    ("  constraints:\n    api_keys: [OPENAI_API_KEY]\n", {"OPENAI_API_KEY": "sk-x"}, None),
], ids=["names-none", "needs-none", "named-unset", "named-set"])
def test_check_warns_of_an_api_without_a_key_and_of_a_key_not_set(keys, environ, warned):
    warnings = check_warnings(parse_idea((LLM_IDEA + keys).encode()), environ)
    assert warnings == ([] if warned is None else [warnings[0]])
    if warned:
        assert warnings[0].startswith(warned) and "\n" not in warnings[0]


def test_check_says_nothing_of_keys_for_an_idea_that_calls_no_api():
    assert check_warnings(parse_idea(DEMO_IDEA.read_bytes()), {}) == []
    lean = parse_idea(b"idea:\n  title: Gauss sum, checked by a hosted prover\n  domain: mathematics_lean\n"
                      b"  hypothesis: The sum of 0..n is n(n+1)/2; the proof is checked with AXLE_API_KEY.\n")
    assert check_warnings(lean, {}) == [check_warnings(lean, {})[0]]
    assert "its text names AXLE_API_KEY" in check_warnings(lean, {})[0]


def test_labrun_check_prints_the_key_warning_in_one_line_without_prefect(tmp_path):
    idea = tmp_path / "llm.yaml"
    idea.write_text(LLM_IDEA)
    code = ("import sys; from labrun.cli import main; code = main(['check', sys.argv[1]]); "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'prefect'], 'prefect imported'; "
            "sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, str(idea)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "api_keys" in line]
    assert len(lines) == 1 and lines[0].startswith(f"warning: {idea}: constraints.api_keys: none named")
