"""The workspace's file API (labrun.wsfs): the engine never follows a link and never leaves
the workspace, with openat2 and with the component-by-component walk alike. Each attack is
shown to work through plain path operations first (the weak target), then refused."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from labrun import wsfs
from labrun.snapshot import workspace_files
from labrun.wsfs import Beneath, Refused, agent_path

SECRET = "the user's secret"


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Both ways of resolving beneath the root: the kernel's openat2 and the walk used where
    the kernel lacks it."""
    if request.param == "walk":
        monkeypatch.setattr(wsfs, "_openat2_works", False)
    elif wsfs._openat2(os.open("/", os.O_RDONLY), ".", os.O_RDONLY | os.O_DIRECTORY, 0) is None:
        pytest.skip("this kernel has no openat2 (Linux 5.6 or later)")
    return request.param


@pytest.fixture
def planted(tmp_path):
    """A workspace whose agent planted links to a secret outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text(SECRET)
    root = tmp_path / "ws"
    (root / ".labrun").mkdir(parents=True)
    (root / "results").mkdir()
    (root / "results" / "file-link").symlink_to(outside / "secret")
    (root / "dir-link").symlink_to(outside)
    (root / ".STATE.md.tmp").symlink_to(outside / "secret")
    (root / "STATE.md").symlink_to(outside / "secret")
    os.mkfifo(root / "fifo")
    return root, outside / "secret"


def test_reads_through_a_planted_link_are_refused(planted, resolver):
    root, secret = planted
    for name in ["results/file-link", "dir-link/secret"]:
        assert SECRET in (root / name).read_text()  # the weak target: the name as resolved
        with pytest.raises(Refused, match="a link"):
            Beneath(root).read_text(name)
    assert not Beneath(root).is_file("dir-link/secret") and not Beneath(root).exists("results/file-link")


def test_a_fifo_cannot_hang_the_engine(planted, resolver):
    root, _ = planted
    with pytest.raises(Refused, match="not a regular file"):
        Beneath(root).read_text("fifo")


def test_writes_replace_a_planted_link_and_never_write_through_it(planted, resolver):
    root, secret = planted
    files = Beneath(root)
    files.write("STATE.md", "the engine's state")  # a link where the engine writes: replaced
    assert secret.read_text() == SECRET
    assert not (root / "STATE.md").is_symlink() and (root / "STATE.md").read_text() == "the engine's state"
    with pytest.raises(Refused, match="a link or a file"):
        files.write("dir-link/secret", "overwritten")  # a link on the way: refused
    assert secret.read_text() == SECRET
    assert (root / ".STATE.md.tmp").is_symlink()  # the engine never made a temporary file there
    assert list((root / ".labrun" / "staging").iterdir()) == []


def test_a_link_swapped_in_while_the_engine_writes_gains_nothing(tmp_path, resolver):
    """A race: an agent process swapping a folder for a link as fast as it can."""
    root = tmp_path / "ws"
    (root / "results").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            try:
                os.rename(root / "results", root / "real")
                os.symlink(outside, root / "results")
                os.unlink(root / "results")
                os.rename(root / "real", root / "results")
            except OSError:
                pass

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for i in range(300):
            try:
                Beneath(root).write(f"results/{i}.json", "{}")
            except (Refused, OSError):
                pass
    finally:
        stop.set()
        swapper.join()
    assert list(outside.iterdir()) == []


def test_the_walk_lists_regular_files_and_never_descends_a_link(planted, resolver):
    root, _ = planted
    (root / "results" / "real.json").write_text("{}")
    assert sorted(name for name, _ in Beneath(root).files()) == ["results/real.json"]
    assert sorted(name for name, _ in Beneath(root).files(links=True)) == [
        ".STATE.md.tmp", "STATE.md", "dir-link", "results/file-link", "results/real.json"]


def test_a_copy_is_of_the_file_found_never_a_link_to_it(planted, resolver, tmp_path):
    root, _ = planted
    (root / "results" / "real.json").write_text("{}")
    digest, _ = Beneath(root).copy("results/real.json", tmp_path / "kept" / "a")
    assert digest == hashlib.sha256(b"{}").hexdigest()
    assert os.stat(tmp_path / "kept" / "a").st_ino != os.stat(root / "results" / "real.json").st_ino
    with pytest.raises(Refused):
        Beneath(root).copy("results/file-link", tmp_path / "kept" / "b")
    assert not (tmp_path / "kept" / "b").exists()


def test_a_sparse_terabyte_is_neither_read_whole_nor_copied_whole(tmp_path, resolver):
    root = tmp_path / "ws"
    root.mkdir()
    with open(root / "big.bin", "wb") as f:
        f.truncate(1 << 40)
        f.seek(1 << 30)
        f.write(b"data")
    with pytest.raises(Refused, match="more than labrun reads"):
        Beneath(root).read_bytes("big.bin")
    digest, st = Beneath(root).copy("big.bin", tmp_path / "copy.bin")
    assert digest is None and st.st_size == 1 << 40
    copied = os.stat(tmp_path / "copy.bin")
    assert copied.st_size == 1 << 40 and copied.st_blocks * 512 < 1 << 24  # its holes stayed holes
    with open(tmp_path / "copy.bin", "rb") as f:
        f.seek(1 << 30)
        assert f.read(4) == b"data"


def test_a_deep_tree_is_walked_one_folder_at_a_time(tmp_path, resolver):
    root = tmp_path / "ws"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    for _ in range(1100):  # a thousand nested folders (as `bash` makes them): no recursion, one descriptor
        os.mkdir("d", dir_fd=fd)
        fd, up = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(up)
    os.close(os.open("far.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    (root / "d" / "f.txt").write_text("x")
    try:
        found = [name for name, _ in Beneath(root).files()]
        assert found == ["d/f.txt"]  # what lies deeper than MAX_DEPTH is not the work
        assert list(workspace_files(root)) == ["d/f.txt"]
    finally:  # pytest's own clean-up recurses once a level: take the tree down here
        os.unlink(root / "d" / "f.txt")
        while (root / "d" / "d").is_dir():  # the next level up, one rename at a time
            os.rename(root / "d" / "d", root / "up")
            os.rmdir(root / "d")
            os.rename(root / "up", root / "d")
        shutil.rmtree(root / "d")


def test_a_folder_where_the_engine_writes_a_file_is_kept_beside_it(tmp_path, resolver):
    root = tmp_path / "ws"
    (root / "STATE.md" / "inner").mkdir(parents=True)
    (root / "STATE.md" / "inner" / "notes").write_text("mine")
    Beneath(root).write("STATE.md", "the engine's")
    assert (root / "STATE.md").read_text() == "the engine's"
    aside = [p for p in root.iterdir() if p.name.startswith("STATE.md.in-the-way-")]
    assert len(aside) == 1 and (aside[0] / "inner" / "notes").read_text() == "mine"


@pytest.mark.parametrize("name, why", [
    ("/etc/passwd", "absolute path outside"), ("../x", "goes up"), ("a/../../x", "goes up"),
    (".env", "hidden path"), ("a/.git/config", "hidden path"), ("", "not a file name"), (".", "the workspace itself"),
    ("a\0b", "not a file name"),
])
def test_agent_paths_are_refused_in_one_line_that_says_which(name, why, tmp_path):
    with pytest.raises(Refused, match=why) as refused:
        agent_path(name, tmp_path)
    assert "\n" not in str(refused.value)


def test_an_absolute_path_inside_the_workspace_is_its_relative_one(tmp_path):
    assert agent_path(f"{tmp_path}/results/./m.json", tmp_path) == "results/m.json"


# -- properties: whatever path an agent names, through whatever links it planted ----------------

COMPONENTS = st.sampled_from(["a", "b", "..", ".", ".hidden", "link-out", "link-in", "link-up", "f"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(COMPONENTS, min_size=1, max_size=5), absolute=st.booleans())
def test_no_path_an_agent_names_reaches_outside(tmp_path_factory, parts, absolute):
    base = tmp_path_factory.mktemp("p")
    outside = base / "outside"
    (outside / "a").mkdir(parents=True)
    for f in (outside / "f", outside / "a" / "f"):
        f.write_text(SECRET)
    root = base / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (root / ".labrun").mkdir()
    (root / "a" / "f").write_text("mine")
    (root / "link-out").symlink_to(outside)
    (root / "a" / "link-in").symlink_to(root / "a")
    (root / "a" / "link-up").symlink_to("..")
    name = "/".join(parts)
    if absolute:
        name = f"{root}/{name}"
    files = Beneath(root)
    try:
        rel = agent_path(name, root)
    except Refused as e:
        assert "\n" not in str(e)
        return
    for op in (files.read_text, files.is_file, files.exists, lambda r: list(files.files(r))):
        try:
            result = op(rel)
        except (Refused, OSError):
            continue
        assert SECRET not in str(result)
    try:
        files.write(rel, "engine")
        wrote = True
    except (Refused, OSError):
        wrote = False
    assert all(p.read_text() == SECRET for p in (outside / "f", outside / "a" / "f"))
    steps = rel.split("/")
    blocked = any((root.joinpath(*steps[:i])).is_file() for i in range(1, len(steps)))  # a file as a folder
    if not any(p.startswith("link") for p in steps) and not blocked and not (root / rel).is_dir():
        assert wrote and files.read_text(rel) == "engine"  # no link on the way: the engine does act
