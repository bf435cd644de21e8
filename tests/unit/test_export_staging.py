"""A failed export run's temporary directory: removed for good, never brought back by a task
Spark has not stopped yet."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from pymq.export import arrow_writer
from pymq.export.arrow_writer import make_dirs_below, remove_staging


def test_partition_directories_are_made_below_the_run_s_directory(tmp_path):
    root = tmp_path / "_pymq_temporary-run"
    root.mkdir()
    target = root / "topic=Orders" / "date=2026-11-28"
    make_dirs_below(str(root), str(target))
    assert target.is_dir()
    make_dirs_below(str(root), str(target))  # again: nothing to do
    make_dirs_below(str(root), str(root))
    with pytest.raises(ValueError, match="not below"):
        make_dirs_below(str(root), str(tmp_path / "elsewhere"))


def test_a_run_directory_removed_after_the_check_is_not_recreated(tmp_path, monkeypatch):
    """Removed between make_dirs_below's check and its mkdir: still not brought back."""
    root = tmp_path / "_pymq_temporary-run"
    monkeypatch.setattr(arrow_writer.os.path, "isdir", lambda path: True)
    with pytest.raises(FileNotFoundError):
        make_dirs_below(str(root), str(root / "topic=Orders" / "date=2026-11-28"))
    assert not root.exists()


@pytest.mark.parametrize("below", ["", "topic=Orders"])
def test_a_task_never_recreates_a_removed_run_directory(tmp_path, below):
    root = tmp_path / "_pymq_temporary-run"
    with pytest.raises(FileNotFoundError, match="is gone"):
        make_dirs_below(str(root), str(root / below) if below else str(root))
    assert not root.exists()


def test_removal_is_tried_again_when_a_task_adds_a_file_meanwhile(tmp_path, monkeypatch):
    staging = tmp_path / "_pymq_temporary-run"
    (staging / "topic=a").mkdir(parents=True)
    (staging / "topic=a" / "part-00000.parquet").write_bytes(b"x")
    real = shutil.rmtree
    calls = []

    def racing(path: str, ignore_errors: bool = False) -> None:
        calls.append(path)
        if len(calls) > 1:
            real(path, ignore_errors=ignore_errors)
            return
        # What rmtree(ignore_errors=True) leaves when a straggling task adds a file while it
        # runs: the entries it listed are gone, the new one is not, nor (ENOTEMPTY) the root.
        for entry in os.listdir(path):
            real(os.path.join(path, entry))
        (staging / "part-00001.parquet").write_bytes(b"y")

    monkeypatch.setattr(arrow_writer.shutil, "rmtree", racing)
    monkeypatch.setattr(arrow_writer, "STAGING_REMOVE_PAUSE", 0)
    remove_staging(str(staging))
    assert not staging.exists()
    assert len(calls) == 2


def test_a_directory_that_will_not_go_is_reported_not_raised(tmp_path, monkeypatch, caplog):
    staging = tmp_path / "_pymq_temporary-run"
    staging.mkdir()
    calls = []
    monkeypatch.setattr(
        arrow_writer.shutil, "rmtree", lambda path, ignore_errors=False: calls.append(path)
    )
    monkeypatch.setattr(arrow_writer, "STAGING_REMOVE_PAUSE", 0)
    with caplog.at_level(logging.WARNING, logger="pymq.export.arrow_writer"):
        remove_staging(str(staging))
    assert len(calls) == arrow_writer.STAGING_REMOVE_TRIES
    assert "could not remove" in caplog.text
    assert os.path.isdir(staging)
