"""The disk-use ratio as Java 4.9.4 (UtilAll.getDiskPartitionSpaceUsedPercent) and ``df``
compute it: used over used + available, rounded up to a whole per cent (issue #37, item 4).

On a filesystem that reserves blocks for root, free (f_bfree) and available (f_bavail) differ;
a ratio over the whole size counts the reserved blocks as used and sends the clean service to
delete files, unexpired ones too, on a half-empty disk.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

from pymq.store.clean_service import DiskSpace, disk_space, disk_used_ratio
from tests.store.helpers import make_message, running_store, small_config, write_ballast
from tests.store.test_clean import Clock, cl_files, fill_files, local_ms

KIB = 1024


def fake_statvfs(
    monkeypatch: pytest.MonkeyPatch, under: str, blocks: int, bfree: int, bavail: int
) -> None:
    """os.statvfs answers these 4 KiB-block counts for paths under ``under``."""
    real: Callable[[str], os.statvfs_result] = os.statvfs

    def statvfs(path: str) -> os.statvfs_result:
        if not os.path.abspath(path).startswith(under):
            return real(path)
        return os.statvfs_result((4096, 4096, blocks, bfree, bavail, 1000, 900, 900, 0, 255))

    monkeypatch.setattr(os, "statvfs", statvfs)


@pytest.mark.parametrize(
    ("blocks", "bfree", "bavail", "expected"),
    [
        (1000, 600, 550, 0.43),  # 400 / 950 = 42.1 %, up to 43 % (whole size: 45 %)
        (1000, 600, 600, 0.40),  # exactly 40 %: not rounded up
        (1000, 720, 100, 0.74),  # 280 / 380 = 73.7 % (whole size: 90 %)
        (1000, 1000, 900, 0.0),  # nothing used
        (1000, 100, 0, 1.0),  # nothing available: full, though 10 % is free for root
        (1000, 0, 0, 1.0),
        (0, 0, 0, -1.0),  # no blocks (a pseudo filesystem): unknown, as Java's -1
    ],
)
def test_ratio_is_used_over_used_plus_available(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: pathlib.Path,
    blocks: int,
    bfree: int,
    bavail: int,
    expected: float,
) -> None:
    fake_statvfs(monkeypatch, str(tmp_path), blocks, bfree, bavail)
    assert disk_used_ratio(str(tmp_path)) == expected
    assert disk_space(str(tmp_path)) == DiskSpace(blocks * 4096, bfree * 4096, bavail * 4096)


def test_an_unreadable_path_has_no_ratio(tmp_path: pathlib.Path) -> None:
    assert disk_space(str(tmp_path / "missing")) is None
    assert disk_used_ratio(str(tmp_path / "missing")) == -1.0
    assert disk_used_ratio("bad\0path") == -1.0


async def test_a_reserved_quarter_does_not_clean_young_files(
    monkeypatch: pytest.MonkeyPatch, root: str
) -> None:
    """74 % used by Java's measure (280 / 380, rounded up), 90 % of the whole size: below
    diskMaxUsedSpaceRatio (75) and the forced clean (85), so young files stay."""
    clock = Clock(local_ms(10, 12))
    config = small_config(root, max_index_num=100_000)
    async with running_store(config, clock_ms=clock, mtime=lambda _p: clock.now / 1000) as store:
        await fill_files(store)
        files = cl_files(store)
        fake_statvfs(monkeypatch, root, 1000, 720, 100)
        await store.clean_files_once()
        service = store.clean_commitlog
        assert service.last_ratio == 0.74
        assert not service.clean_immediately and not service.disk_full
        assert cl_files(store) == files
        assert store.runtime_info()["commitLogDiskRatio"] == "0.7400"
        # Truly fuller: 880 / 980 = 89.8 %, up to 90 %: above 85 %, forced whatever the age.
        fake_statvfs(monkeypatch, root, 1000, 120, 100)
        await store.clean_files_once()
        assert service.last_ratio == 0.90
        assert service.clean_immediately and not service.disk_full
        assert cl_files(store) == files[-1:]
        assert (await store.put(make_message())).status.name == "PUT_OK"


def _df_percent(path: str) -> int | None:
    """``df``'s Use% for ``path`` (an independent measure), or None without a usable df."""
    df = shutil.which("df")
    if df is None:
        return None
    out = subprocess.run([df, "--output=pcent", path], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return int(out.stdout.split()[-1].rstrip("%"))


@pytest.fixture
def reserved_ext4(tmp_path: pathlib.Path) -> Iterator[str]:
    """A real 8 MiB ext4 filesystem that reserves 40 % of its blocks for root (free and
    available differ by that much); skipped where loop mounts are not allowed."""
    image, mount = tmp_path / "fs.img", tmp_path / "fs"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(8 * 1024 * KIB)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "40", str(image)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 unavailable: {made.stderr!r}")
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"loop mount not allowed here: {mounted.stderr!r}")
    try:
        yield str(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_real_filesystem_with_reserved_blocks_reads_as_df_does(reserved_ext4: str) -> None:
    write_ballast(os.path.join(reserved_ext4, "ballast"), 2 * 1024 * KIB)
    os.sync()
    st = os.statvfs(reserved_ext4)
    assert st.f_bfree - st.f_bavail > st.f_blocks // 3  # the reserve is real
    ratio = disk_used_ratio(reserved_ext4)
    df = _df_percent(reserved_ext4)
    if df is not None:
        assert ratio == df / 100
    # Below diskMaxUsedSpaceRatio (75 %), where counting the reserve as used reads above it.
    assert ratio < 0.75 < (st.f_blocks - st.f_bavail) / st.f_blocks
