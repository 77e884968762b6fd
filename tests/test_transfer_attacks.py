"""Attacks on experiments on other machines (`labrun.transfer`), found by a red team: each
failed against the transfer before its fix (an assertion that fails means the attack got
through), and is refused now. Unit level: the worker's side is played by the same calls the
attempt flow makes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from labrun import transfer
from labrun.evidence import Evidence
from labrun.snapshot import workspace_files
from labrun.transfer import Store
from labrun.workspace import Workspace
from test_transfer import SESSION, make_workspace


def worker_attempt(root: Path, n: int, command) -> None:
    """What the real task does on the worker (`_run`, `AttemptRecords.wrote`): the command,
    then `wrote` = what changed from the workspace as built, and a run file with its end."""
    ws = Workspace(root)
    command(root)
    record = json.loads(ws.attempt_file(n, "files").read_text())
    after = workspace_files(root)
    wrote = sorted(k for k in record["before"].keys() | after.keys() if record["before"].get(k) != after.get(k))
    ws.attempt_file(n, "files").write_text(json.dumps({**record, "wrote": wrote,
                                                       "after": {k: after[k] for k in wrote if k in after}}))
    ws.attempt_log(n).write_text("ran\n")
    ws.attempt_file(n, "supervisor").write_text(json.dumps({"exit_code": 0}))
    ws.attempt_file(n, "run").write_text(json.dumps({"ended": {"n": n, "status": "SUCCESS"}}))


def round_trip(tmp_path: Path, ws: Workspace, command, n: int = 1) -> transfer.Manifest:
    store = Store(str(tmp_path / "store"))
    transfer.send(ws, store, SESSION, n, [])
    there = tmp_path / "worker"
    there.mkdir()
    started = transfer.materialize(store, SESSION, n, there)
    worker_attempt(there, n, command)
    transfer.send_back(store, SESSION, n, there, started)
    return transfer.receive(ws, Store(store.url), SESSION, n, [])


def test_a_file_that_does_not_come_back_is_vouched_with_the_engines_local_bytes(tmp_path):
    """ATTACK: a planned output named with a backslash (printable: the snapshot walks it, but
    `agent_file` refuses it, so it never travels either way). The agent writes it by hand on the
    engine's side with made-up numbers; the remote attempt writes a file of the same name; the
    worker's `wrote` lists it, `receive` digests the ENGINE's local (hand-made) file as its
    `after`, and `Evidence.computed_file` then vouches for the hand-made file as computed."""
    name = "results\\table.csv"
    ws = make_workspace(tmp_path / "ws", {"train.py": b"print(1)\n", name: b"accuracy,0.99\n"})  # made by hand
    out = round_trip(tmp_path, ws, lambda root: (root / name).write_text("accuracy,0.51\n"))  # what really ran
    assert name not in out.files  # it never came back
    record = json.loads(ws.attempt_file(1, "files").read_text())
    fabricated = hashlib.sha256(b"accuracy,0.99\n").hexdigest()
    evidence = Evidence(ws.root, [SimpleNamespace(n=1, status="SUCCESS", unmeasured=None)], {1: record})
    vouched = evidence.computed_file(name)
    assert not (record["after"].get(name) == fabricated and vouched), (
        f"the engine recorded attempt 1 as having written {name!r} with the hand-made bytes "
        f"(after={record['after'].get(name)}) and vouches for it as computed ({vouched})")


def test_a_file_turned_into_a_folder_on_the_worker_is_lost_on_return(tmp_path):
    """ATTACK/bug: the attempt removes a file `results` and makes a folder `results/` with its
    outputs. `receive` writes the files before it applies the removals, so `results/metrics.json`
    is refused (its parent is still a file), then `results` is removed: the output is gone
    while the record says the attempt wrote it."""
    ws = make_workspace(tmp_path / "ws", {"train.py": b"print(1)\n", "results": b"placeholder\n"})

    def command(root: Path) -> None:
        (root / "results").unlink()
        (root / "results").mkdir()
        (root / "results/metrics.json").write_text('{"acc": 0.9}')

    round_trip(tmp_path, ws, command)
    record = json.loads(ws.attempt_file(1, "files").read_text())
    assert "results/metrics.json" in record["wrote"]
    assert (ws.root / "results/metrics.json").is_file(), (
        "the attempt's output results/metrics.json was not written into the workspace (refused: "
        f"'results' was still a file), though its record says it wrote it; workspace has: "
        f"{sorted(p.name for p in ws.root.iterdir())}")


def test_a_key_only_the_worker_has_comes_back_in_a_file_unredacted(tmp_path, monkeypatch):
    """ATTACK: the docs say a remote attempt's keys come from the WORKER's environment (or its
    server's Secret blocks), so the engine never holds their values. The command, given the
    key, writes it (and its base64) into a workspace file. It travels back through the store
    as a plain blob, and the engine's redaction (the second line: `labrun.secrets`, applied to
    every tool result) does not know the value: `cat` in the agent's bash shows it to the
    model. Here (no pool) the key is the engine's own and the same `cat` is redacted."""
    import base64

    from labrun.secrets import redact

    key = "wk" + "3f9a1c7e5b2d4068" * 2  # a key of no known shape (a lab's own service, W&B, ...)
    ws = make_workspace(tmp_path / "ws", {"train.py": b"print(1)\n"})
    store = Store(str(tmp_path / "store"))
    transfer.send(ws, store, SESSION, 1, [])
    there = tmp_path / "worker"
    there.mkdir()
    with monkeypatch.context() as worker:  # the worker's process: the key in its environment
        worker.setenv("LAB_SERVICE_API_KEY", key)
        started = transfer.materialize(store, SESSION, 1, there)
        worker_attempt(there, 1, lambda root: (root / "debug.txt").write_text(
            f"using {os.environ['LAB_SERVICE_API_KEY']}\n{base64.b64encode(key.encode()).decode()}\n"))
        assert key not in redact((there / "debug.txt").read_text())  # on the worker it would be redacted
        transfer.send_back(store, SESSION, 1, there, started)
    assert "LAB_SERVICE_API_KEY" not in os.environ  # the engine's process
    transfer.receive(ws, Store(store.url), SESSION, 1, [])
    in_store = any(key.encode() in p.read_bytes() for p in (tmp_path / "store/blobs").iterdir())
    shown = redact((ws.root / "debug.txt").read_text())  # what `bash cat debug.txt` hands the model
    assert key not in shown and not in_store, (
        f"the worker's key reached the store as a plain blob ({in_store}) and the model unredacted: {shown!r}")


def test_a_folder_turned_into_a_file_on_the_worker_makes_receive_fail_every_time(tmp_path):
    """ATTACK: the command replaces a folder `cache/` (holding `cache/a`) with a file `cache`,
    and exits 1 (a FAILED attempt the agent would rather hide). `receive` writes `cache` first
    (the folder is set aside), then removes `cache/a` -> NotADirectoryError, an OSError
    `Beneath.remove`'s caller does not expect: `run_on_pool` turns it into INTERRUPTED, "an
    infrastructure failure, not the experiment's", and the run file (with FAILED) is never
    merged; a resume receives again and fails the same way."""
    ws = make_workspace(tmp_path / "ws", {"train.py": b"print(1)\n", "cache/a": b"x\n"})

    def command(root: Path) -> None:
        shutil.rmtree(root / "cache")
        (root / "cache").write_text("now a file\n")

    store = Store(str(tmp_path / "store"))
    transfer.send(ws, store, SESSION, 1, [])
    there = tmp_path / "worker"
    there.mkdir()
    started = transfer.materialize(store, SESSION, 1, there)
    worker_attempt(there, 1, command)
    Workspace(there).attempt_file(1, "run").write_text(json.dumps({"ended": {"n": 1, "status": "FAILED",
                                                                            "error": "exit code 1"}}))
    transfer.send_back(store, SESSION, 1, there, started)
    errors = []
    for _ in range(2):  # the first receive, and a resume's
        try:
            transfer.receive(ws, Store(store.url), SESSION, 1, [])
        except (transfer.StorageError, transfer.TransferRefused, OSError) as e:  # what run_on_pool maps to INTERRUPTED
            errors.append(repr(e))
    run_file = ws.attempt_file(1, "run")
    ended = json.loads(run_file.read_text()).get("ended") if run_file.exists() else None
    assert not errors and ended and ended["status"] == "FAILED", (
        f"receive raised {errors}: run_on_pool records INTERRUPTED (an infrastructure failure) instead of "
        f"the attempt's FAILED; run file's ended = {ended}; workspace: {sorted(p.name for p in ws.root.iterdir())}")


def test_storage_in_or_above_the_workspace_or_relative_is_refused_in_one_line(tmp_path):
    """Storage inside the workspace is storage the agent's commands write: its out.json and
    blobs would come back as an attempt's record. Refused before anything runs, in one line."""
    ws = make_workspace(tmp_path / "ws", {"train.py": b"print(1)\n"})
    for url, why in [(str(ws.root / "xfer"), "in or above the workspace"), (str(tmp_path), "in or above the workspace"),
                     ("xfer", "absolute path")]:
        with pytest.raises(transfer.StorageError) as refused:
            transfer.check_storage(url, str(ws.root))
        assert why in str(refused.value) and len(str(refused.value).splitlines()) == 1
    transfer.check_storage(str(tmp_path / "store"), str(ws.root))  # beside it: fine


def test_a_sparse_file_does_not_cost_its_whole_apparent_size_in_storage_and_on_the_engine(tmp_path):
    """ATTACK: the remote command makes a sparse file (`truncate -s`), which costs it no disk.
    Here (no pool) the snapshot never reads a file above LABRUN_HASH_MAX_MB; the transfer reads
    all of it, writes all of it into the store and again into the engine's workspace: a
    command with a 16 TiB sparse file keeps the worker busy for days (the engine waits on its
    flow run with no end) and fills both disks. Shown with 256 MiB."""
    ws = make_workspace(tmp_path / "ws", {"train.py": b"print(1)\n"})
    size = 256 << 20
    clock = time.monotonic()

    def command(root: Path) -> None:
        with open(root / "big.bin", "wb") as f:
            f.truncate(size)
        assert os.stat(root / "big.bin").st_blocks == 0  # costs the command nothing

    round_trip(tmp_path, ws, command)
    took = time.monotonic() - clock
    stored = sum(p.stat().st_blocks * 512 for p in (tmp_path / "store/blobs").iterdir())
    here = os.stat(ws.root / "big.bin").st_blocks * 512 if (ws.root / "big.bin").exists() else 0
    assert stored + here < size // 8, (
        f"a sparse file of {size >> 20} MiB that used no disk on the worker took {stored >> 20} MiB in the store and "
        f"{here >> 20} MiB in the engine's workspace ({took:.1f} s)")
