"""The workspace by content (labrun.transfer): an attempt's files go to the store by digest,
only those it lacks; a fresh workspace is built from them; what the attempt changed comes back
and is written into the workspace as if it had run there. No link is followed on either side
and a manifest names nothing outside: each attack is first shown to work against a naive copy
(`shutil.copytree`, plain path writes), then refused. Real files, a real local store, and
fsspec's `file://` and `memory://` for the URL form."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from labrun import transfer
from labrun.snapshot import workspace_files
from labrun.transfer import Entry, Manifest, StorageError, Store, TransferRefused
from labrun.workspace import Workspace
from support import DEMO_IDEA

SECRET = b"the worker's own secret"
SESSION = "0123456789ab"


def make_workspace(root: Path, files: dict[str, bytes], n: int = 1) -> Workspace:
    """A session's workspace as the engine leaves it when attempt n starts: the agent's files,
    the idea's copy, the state, and the attempt's snapshot (`files.json`)."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    ws = Workspace(root)
    ws.attempts.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DEMO_IDEA, ws.idea_copy)
    ws.state_file.write_text(json.dumps({"session_id": SESSION}))
    snapshot(ws, n)
    return ws


def snapshot(ws: Workspace, n: int) -> None:
    ws.write_json(ws.attempt_file(n, "files"), {"before": workspace_files(ws.root), "wrote": None})


def blob_bytes(store: Store) -> int:
    return sum(store.fs.size(p) for p in store.fs.find(store._path("blobs")))


@pytest.fixture(params=["path", "file-url", "memory-url"])
def store(request, tmp_path):
    url = {"path": str(tmp_path / "store"), "file-url": f"file://{tmp_path}/store",
           "memory-url": f"memory://labrun-{uuid.uuid4().hex}"}[request.param]
    return Store(url)


def run_there(store: Store, n: int, root: Path, attempt) -> Manifest:
    """Attempt n on the worker's side: built from the store in `root`, `attempt(root)` run
    there as its task would, what it changed sent back."""
    started = transfer.materialize(store, SESSION, n, root)
    attempt(root)
    return transfer.send_back(store, SESSION, n, root, started)


def an_attempt(n: int):
    """What an attempt's task leaves: a changed file, a new output, a removed file, and its
    records (log, report, what it wrote, its run file with its record)."""
    def attempt(root: Path) -> None:
        ws = Workspace(root)
        (root / "train.py").write_text("print('trained again')\n")
        (root / "results").mkdir(exist_ok=True)
        (root / "results/metrics.json").write_text('{"accuracy": 0.91}')
        (root / "notes.txt").unlink()
        ws.attempt_log(n).write_text("trained\n")
        ws.attempt_file(n, "supervisor").write_text(json.dumps({"exit_code": 0}))
        record = json.loads(ws.attempt_file(n, "files").read_text())
        after = workspace_files(root)
        ws.attempt_file(n, "files").write_text(json.dumps({**record, "wrote": sorted(
            k for k in record["before"].keys() | after.keys() if record["before"].get(k) != after.get(k))}))
        ws.attempt_file(n, "run").write_text(json.dumps({"ended": {"status": "SUCCESS", "metrics": {"accuracy": 0.91}}}))
    return attempt


def test_an_attempt_goes_there_by_content_and_its_outputs_come_back_as_if_it_ran_here(store, tmp_path):
    big = os.urandom(300_000)
    ws = make_workspace(tmp_path / "ws", {"train.py": b"print('train')\n", "notes.txt": b"notes\n",
                                          "data/big.bin": big, "src/model.py": b"W = 1\n"})
    (ws.root / "train.py").chmod(0o755)
    before = json.loads(ws.attempt_file(1, "files").read_text())["before"]

    sent = transfer.send(ws, store, SESSION, 1, [])
    assert set(sent.files) == {"train.py", "notes.txt", "data/big.bin", "src/model.py"}
    assert sent.files["train.py"].executable and not sent.files["notes.txt"].executable
    assert store.sent == blob_bytes(store) >= len(big)

    there = tmp_path / "worker"
    there.mkdir()
    out = run_there(Store(store.url), 1, there, an_attempt(1))
    assert (there / "data/big.bin").read_bytes() == big  # built from the store alone
    assert os.stat(there / "train.py").st_mode & 0o100
    assert set(out.files) == {"train.py", "results/metrics.json"} and out.removed == ["notes.txt"]

    assert transfer.receive(ws, Store(store.url), SESSION, 1, []) is not None
    assert (ws.root / "results/metrics.json").read_text() == '{"accuracy": 0.91}'
    assert (ws.root / "train.py").read_text() == "print('trained again')\n"
    assert not (ws.root / "notes.txt").exists() and (ws.root / "data/big.bin").read_bytes() == big
    assert json.loads(ws.attempt_file(1, "run").read_text())["ended"]["status"] == "SUCCESS"
    assert ws.attempt_log(1).read_text() == "trained\n"
    record = json.loads(ws.attempt_file(1, "files").read_text())
    assert record["before"] == before  # the snapshot it started from stays the engine's
    assert record["wrote"] == ["notes.txt", "results/metrics.json", "train.py"]
    assert record["after"] == {k: workspace_files(ws.root)[k] for k in ("results/metrics.json", "train.py")}


def test_only_the_files_the_store_lacks_travel(tmp_path):
    store = Store(str(tmp_path / "store"))
    big = os.urandom(1_000_000)
    ws = make_workspace(tmp_path / "ws", {"data/big.bin": big, "train.py": b"print(1)\n"})
    transfer.send(ws, store, SESSION, 1, [])
    first = store.sent
    assert first >= len(big)

    (ws.root / "train.py").write_text("print(2)\n")  # the next attempt: one small file changed
    snapshot(ws, 2)
    again = Store(store.url)
    sent = transfer.send(ws, again, SESSION, 2, [])
    assert set(sent.files) == {"data/big.bin", "train.py"}
    files_json = ws.attempt_file(2, "files").stat().st_size  # its own snapshot, an engine file
    assert again.sent == len(b"print(2)\n") + files_json, (again.sent, first)

    fresh = Store(store.url)  # nothing changed: nothing travels (its snapshot is attempt 2's, byte for byte)
    snapshot(ws, 3)
    transfer.send(ws, fresh, SESSION, 3, [])
    assert fresh.sent == 0


def test_a_link_in_the_workspace_is_not_followed_by_the_engine(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    ws = make_workspace(tmp_path / "ws", {"train.py": b"x\n", "data.txt": b"data\n"})
    # The agent swaps a file for a link to the user's secret after the snapshot took it.
    (ws.root / "data.txt").unlink()
    (ws.root / "data.txt").symlink_to(outside / "secret")

    naive = tmp_path / "naive"
    shutil.copytree(ws.root, naive)  # a copy that follows links: the secret goes along
    assert (naive / "data.txt").read_bytes() == SECRET

    store = Store(str(tmp_path / "store"))
    sent = transfer.send(ws, store, SESSION, 1, [])
    assert "data.txt" not in sent.files and "train.py" in sent.files
    assert hashlib.sha256(SECRET).hexdigest() not in [Path(p).name for p in store.fs.find(store._path("blobs"))]


def test_a_link_on_the_worker_is_not_followed_and_one_on_the_engine_is_not_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    ws = make_workspace(tmp_path / "ws", {"train.py": b"x\n", "notes.txt": b"n\n"})
    store = Store(str(tmp_path / "store"))
    transfer.send(ws, store, SESSION, 1, [])
    there = tmp_path / "worker"
    there.mkdir()

    def attempt(root: Path) -> None:  # the attempt's command leaves a link to the worker's secret
        an_attempt(1)(root)
        (root / "results/stolen.txt").symlink_to(outside / "secret")

    out = run_there(store, 1, there, attempt)
    naive = tmp_path / "naive"
    shutil.copytree(there, naive)
    assert (naive / "results/stolen.txt").read_bytes() == SECRET  # the naive copy would carry it
    assert "results/stolen.txt" not in out.files

    # Meanwhile the agent put a link where the engine will write the attempt's outputs.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws.root / "results").symlink_to(elsewhere, target_is_directory=True)
    (ws.root / "results/naive.json").write_text("{}")  # a plain write goes through it
    assert (elsewhere / "naive.json").exists()
    (elsewhere / "naive.json").unlink()

    transfer.receive(ws, store, SESSION, 1, [])
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    assert json.loads(ws.attempt_file(1, "run").read_text())["ended"]["status"] == "SUCCESS"


@pytest.mark.parametrize("rel", ["../escape.txt", "/tmp/escape.txt", "a/../../escape.txt", ".labrun/state.json",
                                 "STATE.md", "", "a//b"])
def test_a_manifest_naming_a_path_outside_or_the_engines_is_refused_before_anything_is_written(tmp_path, rel):
    store = Store(str(tmp_path / "store"))
    digest, size = store.put(open(DEMO_IDEA, "rb"))
    manifest = Manifest(files={"ok.txt": Entry(sha256=digest, size=size), rel: Entry(sha256=digest, size=size)})
    store.write_manifest(SESSION, 1, "in", manifest)
    root = tmp_path / "worker" / "ws"
    root.mkdir(parents=True)
    naive = tmp_path / "naive" / "ws"
    naive.mkdir(parents=True)
    if ".." in rel:  # a naive materializer (plain path writes) writes outside its folder
        (naive / rel).parent.mkdir(parents=True, exist_ok=True)
        (naive / rel).write_text("x")
        assert (naive / rel).exists() and not (naive / rel).resolve().is_relative_to(naive)

    with pytest.raises(TransferRefused) as refused:
        transfer.materialize(store, SESSION, 1, root)
    assert "\n" not in str(refused.value) and (rel or "''") in str(refused.value)
    assert list(root.iterdir()) == [] and not (tmp_path / "worker/escape.txt").exists()
    with pytest.raises(TransferRefused):  # the engine refuses it in an out.json alike
        store.write_manifest(SESSION, 1, "out", manifest)
        transfer.receive(make_workspace(tmp_path / "ws", {}), store, SESSION, 1, [])


def test_a_link_travels_only_as_a_reference_to_shared_data_the_idea_declares(tmp_path):
    shared = tmp_path / "shared/imagenet"
    shared.mkdir(parents=True)
    ws = make_workspace(tmp_path / "ws", {"train.py": b"x\n"})
    idea = ws.idea_copy.read_text().replace("  background:\n", "  background:\n    datasets:\n"
                                            f"      - name: imagenet\n        source: {shared}\n", 1)
    ws.idea_copy.write_text(idea)
    (ws.root / "data").symlink_to(shared, target_is_directory=True)
    (ws.root / "other").symlink_to(tmp_path / "outside")
    declared = transfer.declared_data(transfer_idea(ws))
    assert declared == [str(shared)]
    store = Store(str(tmp_path / "store"))
    sent = transfer.send(ws, store, SESSION, 1, declared)
    assert sent.links == {"data": str(shared)}
    there = tmp_path / "worker"
    there.mkdir()
    transfer.materialize(store, SESSION, 1, there)
    assert os.readlink(there / "data") == str(shared) and not (there / "other").exists()

    forged = sent.model_copy(update={"links": {"data": "/etc"}})  # a target the idea does not declare
    store.write_manifest(SESSION, 1, "in", forged)
    (tmp_path / "worker2").mkdir()
    with pytest.raises(TransferRefused, match="shared data"):
        transfer.materialize(store, SESSION, 1, tmp_path / "worker2")
    assert not (tmp_path / "worker2/data").exists()


def transfer_idea(ws: Workspace):
    from labrun.idea import load_idea

    return load_idea(ws.idea_copy)


def test_a_damaged_blob_and_unreachable_storage_are_said_in_one_line(tmp_path):
    store = Store(str(tmp_path / "store"))
    ws = make_workspace(tmp_path / "ws", {"train.py": b"print(1)\n"})
    sent = transfer.send(ws, store, SESSION, 1, [])
    Path(store._path("blobs", sent.files["train.py"].sha256)).write_bytes(b"print('evil')\n")
    (tmp_path / "worker").mkdir()
    with pytest.raises(StorageError, match="does not hold what its name says"):
        transfer.materialize(store, SESSION, 1, tmp_path / "worker")
    assert not (tmp_path / "worker/train.py").exists()

    for url in (str(tmp_path / "a-file/store"), "nosuchprotocol://bucket/x"):
        if "a-file" in url:
            (tmp_path / "a-file").write_text("not a folder")
        with pytest.raises(StorageError) as e:
            transfer.check_storage(url)
        assert url.split("/")[0] in str(e.value) and "\n" not in str(e.value)
