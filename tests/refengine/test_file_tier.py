"""The file tier never leaves a half-written block under a block's name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from kvtier.refengine.file_tier import SUFFIX, TMP_SUFFIX, FileTier

SHAPE = (2, 2, 4, 2, 8)
BLOCK_BYTES = 2 * 2 * 4 * 2 * 8 * 4


def tier(folder, blocks=8):
    return FileTier(folder, blocks, SHAPE, torch.float32, "lru", threads=2)


def test_round_trip_and_eviction_removes_the_file(tmp_path):
    files = tier(tmp_path)
    try:
        block = torch.randn(SHAPE)
        files.put(7, block)
        (read,) = files.read_many([7])
        assert torch.equal(read, block)
        files.remove(7)
        assert not files.path(7).exists() and 7 not in files
    finally:
        files.close()


def test_opening_a_folder_removes_leftovers(tmp_path):
    (tmp_path / f"{1:016x}{TMP_SUFFIX}").write_bytes(b"half")
    (tmp_path / f"{2:016x}{SUFFIX}").write_bytes(b"\0" * BLOCK_BYTES)
    files = tier(tmp_path)
    try:
        assert list(tmp_path.iterdir()) == [] and files.hashes == []
    finally:
        files.close()


def test_a_write_interrupted_before_the_rename_leaves_no_block(tmp_path, monkeypatch):
    files = tier(tmp_path)
    try:
        monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("killed")))
        with pytest.raises(OSError):
            files.put(3, torch.randn(SHAPE)).result()
        assert not files.path(3).exists() and 3 not in files and files.write_failures == 1
        assert list(tmp_path.iterdir()) == []
    finally:
        monkeypatch.undo()
        files.close()


WRITER = textwrap.dedent("""
    import sys, torch
    from kvtier.refengine.file_tier import FileTier
    files = FileTier(sys.argv[1], 1 << 30, {shape}, torch.float32, "fifo", threads=4)
    block = torch.randn({shape})
    for h in range(1 << 30):
        written = files.put(h, block)
        if h == 60:
            written.result()
            print("ready", flush=True)
""")


@pytest.mark.timeout(60)
def test_killed_writer_leaves_only_whole_blocks(tmp_path):
    folder = tmp_path / "tier"
    process = subprocess.Popen([sys.executable, "-c", WRITER.format(shape=SHAPE), str(folder)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    blocks = list(folder.glob("*" + SUFFIX))
    assert len(blocks) >= 50
    assert {p.stat().st_size for p in blocks} == {BLOCK_BYTES}
