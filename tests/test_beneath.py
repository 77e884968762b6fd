"""The engine's reads of the agent's paths follow no link (`labrun.beneath`): each case is
first read through the plain path, as the engine once did, then refused."""

from __future__ import annotations

import os
import time

import pytest

from labrun.beneath import Refused, copy_beneath, open_beneath, read_beneath


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "secret").write_text("PRIVATE")
    root = tmp_path / "ws"
    (root / "results").mkdir(parents=True)
    (root / "results/plain.txt").write_text("mine")
    (root / "results/linked.txt").symlink_to(tmp_path / "secret")
    (root / "outside").symlink_to(tmp_path)
    (root / ".venv").symlink_to(tmp_path)
    return root


def test_a_plain_file_and_a_real_folder_are_read(ws, tmp_path):
    assert read_beneath(ws, "results/plain.txt") == b"mine"
    sha, st = copy_beneath(ws, "results/plain.txt", tmp_path / "copy")
    assert (tmp_path / "copy").read_text() == "mine" and st.st_size == 4 and len(sha) == 64
    os.close(open_beneath(ws, "results", folder=True))


@pytest.mark.parametrize("rel, folder, said", [
    ("results/linked.txt", False, "results/linked.txt is a link"),
    ("outside/secret", False, "outside is a link"),
    (".venv", True, ".venv is a link"),
])
def test_a_link_anywhere_on_the_path_is_refused(ws, rel, folder, said):
    assert (ws / rel).exists()  # the weak target: the plain path reaches outside
    with pytest.raises(Refused, match=f"^{said}$"):
        os.close(open_beneath(ws, rel, folder=folder))


def test_what_is_not_a_plain_file_is_refused_without_hanging(ws):
    os.mkfifo(ws / "results/fifo")
    start = time.monotonic()
    with pytest.raises(Refused, match="^results/fifo is not a plain file$"):
        read_beneath(ws, "results/fifo")
    assert time.monotonic() - start < 5
    with pytest.raises(Refused, match="^results/plain.txt is not a folder$"):
        read_beneath(ws, "results/plain.txt/x")
    with pytest.raises(Refused, match="^results/gone is not there$") as missing:
        read_beneath(ws, "results/gone")
    assert missing.value.missing
    with pytest.raises(Refused, match="not a path inside"):
        read_beneath(ws, "../secret")
