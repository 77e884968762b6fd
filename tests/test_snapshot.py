"""Workspace snapshots stay cheap in big workspaces: digests reused while a file is
unchanged, environments and caches found by their markers, big files never read."""

from __future__ import annotations

import os
import time

import pytest

from labrun import snapshot
from labrun.snapshot import entry_digest, workspace_files

OLD = time.time() - 3600  # settled: older than the racy-write window


def write(path, text: str, mtime: float = OLD) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


@pytest.fixture
def root(tmp_path):
    (tmp_path / ".labrun").mkdir()
    snapshot._caches.clear()
    yield tmp_path
    snapshot._caches.clear()


def test_a_digest_is_reused_while_the_file_is_unchanged_and_an_edit_with_its_mtime_set_back_is_seen(root, monkeypatch):
    write(root / "src/a.py", "x = 1\n")
    first = workspace_files(root)["src/a.py"]
    read = []
    monkeypatch.setattr(snapshot, "file_digest", lambda fd, st: read.append(fd) or "re-read")
    assert workspace_files(root)["src/a.py"] == first and not read  # the cached digest stands
    snapshot._caches.clear()  # a new engine process reads the cache from .labrun
    assert workspace_files(root)["src/a.py"] == first and not read
    monkeypatch.undo()
    # Same size, mtime and inode (what `touch -d` and an edit in place can keep), but the
    # ctime, which no command can set back, moved: hashed again.
    with open(root / "src/a.py", "r+") as f:
        f.write("y")
    os.utime(root / "src/a.py", (OLD, OLD))
    assert workspace_files(root)["src/a.py"] != first
    # Any real change moves the mtime (or the size, or the inode): hashed again.
    write(root / "src/a.py", "y = 1\n", mtime=OLD + 1)
    assert workspace_files(root)["src/a.py"] != first


def test_a_file_written_just_now_is_never_served_from_the_cache(root):
    path = root / "run.py"
    path.write_text("a = 1\n")
    first = workspace_files(root)["run.py"]
    mtime = path.stat().st_mtime_ns
    path.write_text("b = 2\n")  # within the same mtime tick, perhaps
    os.utime(path, ns=(mtime, mtime))
    assert workspace_files(root)["run.py"] != first


def test_environments_and_caches_are_found_by_their_markers_not_their_names(root):
    env = root / "env"  # a virtual environment not named .venv or venv
    write(env / "pyvenv.cfg", "home = /usr/bin\n")
    for i in range(50):
        write(env / f"lib/python3.11/site-packages/pkg{i}/__init__.py", "")
    write(root / "checkpoints/CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n")
    write(root / "checkpoints/step-1000.pt", "weights")
    write(root / "conda/conda-meta/history", "")
    write(root / "src/train.py", "pass\n")
    files = workspace_files(root)
    assert set(files) == {"env/", "conda/", "src/train.py"}
    # A package installed into the environment is a change; its files are never listed.
    before = files["env/"]
    time.sleep(0.01)
    (env / "lib/python3.11/site-packages/newpkg").mkdir()
    assert entry_digest(root, "env/") == workspace_files(root)["env/"] != before


def bytes_read() -> int:
    """Bytes this process has read through read() calls (Linux's /proc/self/io)."""
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_file_above_the_threshold_is_recorded_by_its_stat_never_read(root, monkeypatch):
    monkeypatch.setenv("LABRUN_HASH_MAX_MB", "1")
    big = root / "data/big.bin"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(2 << 20)
    st = big.stat()
    read_before = bytes_read()
    assert workspace_files(root)["data/big.bin"] == f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    assert bytes_read() - read_before < 1 << 20  # its 2 MB were not read
    assert entry_digest(root, "data/big.bin") == f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
