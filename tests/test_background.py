"""Background attempts, as the agent's tools: `run_experiment(run_in_background=true)` returns
at once, `experiment_output` follows the attempt, `stop_experiment` ends it; several run at
once up to the session's limit, and the phase cannot complete while one runs. Real sessions,
real supervised commands (`labrun.supervisor`), real Prefect subtasks."""

from __future__ import annotations

import json
import os
import uuid
import time

import pytest

from support import wait_for
from labrun.phases.phase import toolbox
from labrun.phase_registry import BY_KEY
from labrun.supervisor import start_ticks
from labrun.tools import ToolBox


def box(session, phase="experiments") -> ToolBox:
    return toolbox(session, BY_KEY[phase])


def background(b: ToolBox, command: str, **more) -> int:
    result = b.call("run_experiment", {"command": command, "purpose": "a check", "run_in_background": True, **more})
    assert not result.is_error and "RUNNING in the background" in result.content, result.content
    return int(result.content.split()[1].rstrip(":"))


def test_a_background_attempt_returns_at_once_and_experiment_output_follows_it_to_its_end(session):
    (session.ws.root / "src").mkdir()
    (session.ws.root / "src/count.py").write_text(
        "import json, sys, time\n"
        "for i in range(3):\n    print('step', i, flush=True)\n    time.sleep(1)\n"
        "json.dump({'steps': 3}, open('results/m.json', 'w'))\n")
    b = box(session)
    started = time.monotonic()
    n = background(b, "python3 src/count.py", metrics_file="results/m.json")
    assert time.monotonic() - started < 2.5  # the turn goes on: the command takes 3 s
    assert session.state.attempts[n - 1].status == "RUNNING" and session.state.attempts[n - 1].background
    log = session.ws.root / session.state.attempts[n - 1].log
    wait_for(lambda: log.exists() and "step 0" in log.read_text(), what="its first line")
    first = b.call("experiment_output", {"attempt": n}).content
    assert first.startswith(f"Attempt {n}: RUNNING") and "step 0" in first
    last = b.call("experiment_output", {"attempt": n, "wait_s": 30}).content
    assert last.startswith(f"Attempt {n}: SUCCESS") and "Metrics: steps=3" in last
    assert "step 2" in last and "step 0" not in last.split("Output since the last look:")[-1]  # only what is new
    assert session.state.attempts[n - 1].duration_s >= 3


def test_the_phase_cannot_complete_while_an_attempt_runs_and_stop_experiment_ends_it(session):
    b = box(session)
    n = background(b, "sleep 60")
    refused = b.call("complete_phase", {"summary": "done"})
    assert refused.is_error and f"Attempt {n} still runs" in refused.content, refused.content
    wait_for(lambda: (b.session.records.supervised(n).read() or {}).get("pgid"), what="its command to start")
    report = b.session.records.supervised(n).read()
    stopped = b.call("stop_experiment", {"attempt": n}).content
    assert stopped.startswith(f"Attempt {n}: INTERRUPTED") and "stopped by the agent" in stopped
    assert start_ticks(report["pgid"]) is None and start_ticks(report["pid"]) is None  # nothing left running
    again = b.call("stop_experiment", {"attempt": n})
    assert again.is_error and "not running" in again.content
    assert not b.call("complete_phase", {"summary": "done"}).content.startswith("Attempt")


def test_attempts_past_the_limit_wait_for_a_slot_and_an_ended_one_is_told_after_the_next_call(session):
    session.state.parallel_attempts = 1  # `--parallel-attempts 1`
    b = box(session)
    first = background(b, "sleep 2; echo one")
    second = background(b, "echo two")
    wait_for(lambda: "waiting for a free slot" in json.dumps(b.session.records.run(second)), what="the second to wait")
    assert not b.session.records.supervised(second).read()  # not started while the first runs
    done = b.call("experiment_output", {"attempt": second, "wait_s": 60}).content
    assert done.startswith(f"Attempt {second}: SUCCESS"), done
    one, two = (session.state.attempts[k - 1] for k in (first, second))
    ends = [b.session.records.supervised(k).read() for k in (first, second)]
    assert ends[1]["started"] >= ends[0]["ended"]  # one at a time
    assert f"[attempt {first}, run in the background, ended: SUCCESS" in done, done  # told after the next call
    assert f"attempt {first}," not in b.call("bash", {"command": "true"}).content  # told once
    assert one.status == two.status == "SUCCESS"


def test_two_attempts_at_once_may_not_declare_the_same_file(session):
    b = box(session)
    n = background(b, "sleep 30", outputs=["results/a.txt"])
    refused = b.call("run_experiment", {"command": "touch results/a.txt", "purpose": "x", "outputs": ["results/a.txt"]})
    assert refused.is_error and f"attempt {n}, still running, writes results/a.txt too" in refused.content
    assert len(session.state.attempts) == n  # refused: no number
    b.call("stop_experiment", {"attempt": n})


def test_metrics_the_agent_writes_beside_a_running_attempt_are_unconfirmed_until_a_rerun_reproduces_them(session):
    """The cheat that background attempts open: a command whose code computes nothing runs, and
    the agent writes the metrics by hand meanwhile, in a shell call that outlasts the attempt.
    The engine cannot tell those writes from the attempt's own: the attempt records what ran
    beside it, and a claim on it stands only once the engine's rerun reproduced it (without it
    the claim is confirmed, as a foreground attempt's is before its rerun)."""
    from labrun.claims import Claim, standing
    from labrun.state import Reproduction

    (session.ws.root / "src").mkdir()
    (session.ws.root / "src/wait.py").write_text("import time\ntime.sleep(1)\n")
    b = box(session)
    n = background(b, "python3 src/wait.py", metrics_file="results/m.json")
    b.call("bash", {"command": "sleep 0.5; echo '{\"acc\": 0.99}' > results/m.json; sleep 2"})
    done = b.call("experiment_output", {"attempt": n, "wait_s": 30}).content
    assert done.startswith(f"Attempt {n}: SUCCESS") and "acc=0.99" in done
    attempt = session.state.attempts[n - 1]
    assert attempt.beside == ["the agent's own commands"] and attempt.unmeasured is None
    claim = Claim(id="K1", statement="accurate", metric="acc", attempts=[n], value=0.99)
    assert not standing(claim, {n: attempt}, {}, 0.01, 0.001).confirmed
    assert "could have written its files" in standing(claim, {n: attempt}, {}, 0.01, 0.001).status
    alone = attempt.model_copy(update={"beside": []})
    assert standing(claim, {n: alone}, {}, 0.01, 0.001).confirmed  # the weak target: a claim not yet rerun stands
    rerun = attempt.model_copy(update={"reproduction": Reproduction(status="REPRODUCED", detail="the same", metrics={"acc": 0.99})})
    assert standing(claim, {n: rerun}, {}, 0.01, 0.001).confirmed


def test_honest_attempts_side_by_side_and_a_fix_made_while_one_failed_are_not_refused(session):
    """Two honest background attempts each write their own declared files; the agent fixes the
    script while the failing one still runs: the same command with fix_applied runs again."""
    (session.ws.root / "src").mkdir()
    (session.ws.root / "src/fail.py").write_text("import time\ntime.sleep(2)\nraise SystemExit(3)\n")
    b = box(session)
    n = background(b, "python3 src/fail.py", outputs=["results/f.txt"])
    other = background(b, "sleep 1; echo ok > results/o.txt", outputs=["results/o.txt"])
    wait_for(lambda: (b.session.records.supervised(n).read() or {}).get("pgid"), what="its command to start")
    time.sleep(0.5)  # Python has read the script
    b.call("str_replace_based_edit_tool", {"command": "create", "path": "src/fail.py",
                                           "file_text": "open('results/f.txt', 'w').write('fixed')\n"})
    assert b.call("experiment_output", {"attempt": n, "wait_s": 30}).content.startswith(f"Attempt {n}: FAILED")
    assert b.call("experiment_output", {"attempt": other, "wait_s": 30}).content.startswith(f"Attempt {other}: SUCCESS")
    again = b.call("run_experiment", {"command": "python3 src/fail.py", "purpose": "again", "outputs": ["results/f.txt"],
                                      "fix_applied": "the script no longer exits with 3"})
    assert again.content.startswith(f"Attempt {other + 1}: SUCCESS"), again.content
    assert f"attempt {other}" in session.state.attempts[n - 1].beside


def test_more_gpus_than_the_machine_gives_are_refused_in_one_line(session, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    refused = box(session).call("run_experiment", {"command": "true", "purpose": "x", "gpus": 3})
    assert refused.is_error and len(refused.content.splitlines()) == 1 and "3 GPUs" in refused.content
    assert not session.state.attempts


@pytest.mark.parametrize("ended_by", ["error", "keep"])
def test_a_phase_that_ends_with_attempts_running_stops_them_unless_asked_to_keep_them(session, monkeypatch, ended_by):
    if ended_by == "keep":
        monkeypatch.setenv("LABRUN_KEEP_EXPERIMENTS", "on")
    b = box(session)
    n = background(b, "sleep 60")
    wait_for(lambda: (b.session.records.supervised(n).read() or {}).get("pgid"), what="its command to start")
    report = b.session.records.supervised(n).read()
    b.experiments.close(RuntimeError("the turn limit"))
    if ended_by == "keep":
        assert start_ticks(report["pgid"]) is not None and session.state.attempts[n - 1].status == "RUNNING"
        b.session.records.supervised(n).stop()
        return
    assert session.state.attempts[n - 1].status == "INTERRUPTED"
    assert session.state.attempts[n - 1].error == "the phase ended while it ran"
    assert start_ticks(report["pgid"]) is None


def test_background_attempts_get_gpus_of_their_own_and_one_waits_until_one_is_free(session, monkeypatch):
    """A fake device list (this machine has no GPU): two GPUs given to labrun by
    CUDA_VISIBLE_DEVICES, named by ids of this test's own so that no other test's locks are theirs."""
    fake = [f"GPU-{uuid.uuid4()}" for _ in range(2)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(fake))
    monkeypatch.setattr("os.cpu_count", lambda: 8)  # so that the GPUs, not the slots, make the third wait
    b = box(session)
    script = "echo $CUDA_VISIBLE_DEVICES > results/gpu-{n}.txt; date +%s.%N >> results/span-{n}.txt; sleep 3; " \
             "date +%s.%N >> results/span-{n}.txt"
    runs = [background(b, script.format(n=k), gpus=1, outputs=[f"results/gpu-{k}.txt"]) for k in range(3)]
    waited = []
    wait_for(lambda: waited.extend(n for n in runs if "waiting for 1 GPU" in json.dumps(b.session.records.run(n))) or waited,
             what="one of them to wait")  # whichever of the three threads came last
    for n in runs:
        assert b.call("experiment_output", {"attempt": n, "wait_s": 60}).content.startswith(f"Attempt {n}: SUCCESS")
    seen = [(session.ws.root / f"results/gpu-{k}.txt").read_text().strip() for k in range(3)]
    spans = [[float(t) for t in (session.ws.root / f"results/span-{k}.txt").read_text().split()] for k in range(3)]
    last = runs.index(waited[0])
    first, second = [k for k in range(3) if k != last]
    assert seen[first] != seen[second] and {seen[first], seen[second]} == set(fake)  # each its own
    assert spans[first][0] < spans[second][1] and spans[second][0] < spans[first][1]  # those two at once
    assert spans[last][0] >= min(spans[first][1], spans[second][1])  # the third once one was free
    assert [session.state.attempts[n - 1].gpus for n in runs] == [[s] for s in seen]


def test_a_remote_attempt_takes_a_key_its_worker_lacks_from_the_prefect_secret_block_of_its_name(prefect_api, monkeypatch):
    """On a pool's worker the keys come by name: from the worker's environment, else from the
    server's Secret block of the same name (never from a flow run's parameters)."""
    from prefect.blocks.system import Secret

    from labrun.phases.attempts import keys_from_secret_blocks
    from labrun.secrets import redact

    name = f"LABRUN_TEST_KEY_{uuid.uuid4().hex[:8].upper()}"
    value = f"sk-test-{uuid.uuid4().hex}"
    Secret(value=value).save(name.lower().replace("_", "-"))
    monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LABRUN_TEST_HAS_ITS_OWN", "the worker's own")
    keys_from_secret_blocks([name, "LABRUN_TEST_HAS_ITS_OWN", "LABRUN_TEST_NO_SUCH_BLOCK"])
    assert os.environ[name] == value and value not in redact(f"the key is {value}")
    assert os.environ["LABRUN_TEST_HAS_ITS_OWN"] == "the worker's own" and "LABRUN_TEST_NO_SUCH_BLOCK" not in os.environ
    monkeypatch.delenv(name)


def test_a_worker_without_the_sandbox_its_engine_runs_commands_in_does_not_run_the_attempt(session, monkeypatch):
    """On a pool's worker with no bubblewrap, an attempt of an engine that confines its commands
    is not run unconfined: it is INTERRUPTED, saying why, and nothing started. The weak target: a
    spec that does not ask for the sandbox runs it there unconfined."""
    from labrun.phases import attempts
    from labrun.phases.execution import run_here
    from labrun.tools import RunExperimentInput

    monkeypatch.setattr(attempts, "bubblewrap", lambda: None)  # this worker has none
    made = [session.records.new("experiments", RunExperimentInput(command="touch results/ran.txt", purpose="x"), {})
            for _ in range(2)]
    refused = run_here("attempt", attempts.AttemptSpec.of(session, n=made[0].n).model_copy(update={"sandboxed": True}))
    assert refused["status"] == "INTERRUPTED" and "cannot run labrun's sandbox" in refused["error"]
    assert not session.records.supervised(made[0].n).read() and not (session.ws.root / "results/ran.txt").exists()
    ran = run_here("attempt", attempts.AttemptSpec.of(session, n=made[1].n).model_copy(update={"sandboxed": False}))
    assert ran["status"] == "SUCCESS" and (session.ws.root / "results/ran.txt").exists()


def test_what_ran_beside_an_attempt_is_known_after_a_stop_and_after_a_resume(session):
    """Found by a red team: an attempt stopped while another ran (its supervisor killed first,
    so it reported no end) was taken to have ended as it started; and the agent's own commands
    beside an attempt were forgotten by the resume that re-attached to it. Both are beside it."""
    from labrun.model import UsageWindowSpent

    b = box(session)
    writer = background(b, "sleep 60")
    wait_for(lambda: (b.session.records.supervised(writer).read() or {}).get("pgid"), what="the first to start")
    victim = background(b, "sleep 3")
    wait_for(lambda: (b.session.records.supervised(victim).read() or {}).get("pgid"), what="the second to start")
    b.call("stop_experiment", {"attempt": writer})
    b.call("bash", {"command": "true"})
    b.experiments.close(UsageWindowSpent("the window is spent", resets_at=0))  # left to its supervisor
    again = box(session)  # the phase run again, as after the wait or a resume
    again.experiments.adopt(victim)
    assert again.call("experiment_output", {"attempt": victim, "wait_s": 30}).content.startswith(f"Attempt {victim}: SUCCESS")
    assert session.state.attempts[victim - 1].beside == [f"attempt {writer}", "the agent's own commands"]


def test_an_attempt_stopped_while_it_waits_for_its_gpu_never_starts(session, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"GPU-{uuid.uuid4()}")  # one fake GPU
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    b = box(session)
    holder = background(b, "sleep 30", gpus=1)
    wait_for(lambda: (b.session.records.supervised(holder).read() or {}).get("pgid"), what="the first to hold the GPU")
    waiting = background(b, "touch results/started.txt", gpus=1)
    wait_for(lambda: "waiting for 1 GPU" in json.dumps(b.session.records.run(waiting)), what="the second to wait")
    stopped = b.call("stop_experiment", {"attempt": waiting}).content
    assert stopped.startswith(f"Attempt {waiting}: INTERRUPTED") and "stopped by the agent" in stopped, stopped
    assert not b.session.records.supervised(waiting).read() and not (session.ws.root / "results/started.txt").exists()
    b.call("stop_experiment", {"attempt": holder})
