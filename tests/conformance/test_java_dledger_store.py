"""pymq's DLedger store against DLedger 0.2.6's own (the jar RocketMQ 4.9.4 ships), through
java/DLedgerStoreTool.java: a store Java wrote is read by pymq and is byte for byte what pymq
writes for the same entries; a store pymq wrote (with a follower truncation in it) is loaded,
recovered and read by Java.

Needs the Java build (/work/shared/java/README.md): ``$RMQ_BUILD/lib/full.classpath`` with
``dledger-0.2.6.jar`` (RMQ_BUILD defaults to /tmp/rmqjava494); skipped otherwise.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

from pymq.dledger.config import DLedgerConfig
from pymq.dledger.store import DLedgerEntry, DLedgerFileStore, load_term, persist_term

RMQ_BUILD = pathlib.Path(os.environ.get("RMQ_BUILD", "/tmp/rmqjava494"))
CLASSPATH = RMQ_BUILD / "lib" / "full.classpath"
SOURCE = pathlib.Path(__file__).parent / "java" / "DLedgerStoreTool.java"
MAIN = "io.openmessaging.storage.dledger.store.file.DLedgerStoreTool"
DATA_SIZE = 4096
INDEX_SIZE = 32 * 10

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CLASSPATH.exists() or shutil.which("javac") is None,
        reason=f"DLedger 0.2.6 is not built ({CLASSPATH} missing, or no javac): "
        "see /work/shared/java/README.md",
    ),
]


def _classpath() -> str:
    return CLASSPATH.read_text().strip()


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    classes = tmp_path_factory.mktemp("java-classes")
    args = ["javac", "-nowarn", "-cp", _classpath(), "-d", str(classes), str(SOURCE)]
    done = subprocess.run(args, capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return classes


def _java(classes: pathlib.Path, *args: object) -> list[str]:
    cmd = ["java", "-Xmx128m", "-cp", f"{classes}:{_classpath()}", MAIN, *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stdout.decode(errors="replace")[-3000:]
    lines = done.stdout.decode().splitlines()
    return [line for line in lines if line.split(" ", 1)[0] in ("term", "ledger", "entry")]


def _body(i: int) -> bytes:  # DLedgerStoreTool.bodyOf
    return b"".join(b"body-%d;" % i for _ in range(i % 7 + 1))


def _config(base: pathlib.Path) -> DLedgerConfig:
    return DLedgerConfig(
        group="g",
        self_id="n0",
        peers="n0-127.0.0.1:1",
        store_base_dir=str(base),
        mapped_file_size_for_entry_data=DATA_SIZE,
        mapped_file_size_for_entry_index=INDEX_SIZE,
    )


def _files(base: pathlib.Path) -> dict[str, bytes]:
    root = base / "dledger-n0"
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".bak")
    }


def test_pymq_reads_a_store_java_wrote_and_writes_the_same_bytes(java_classes, tmp_path) -> None:
    java_base = tmp_path / "java"
    _java(java_classes, "write", java_base, DATA_SIZE, INDEX_SIZE, 150, 120)
    store = DLedgerFileStore(_config(java_base))
    store.open()
    assert (store.ledger_begin_index, store.ledger_end_index, store.ledger_end_term) == (0, 149, 2)
    assert store.committed_index == 120
    assert [store.get(i).body for i in range(150)] == [_body(i) for i in range(150)]
    assert load_term(str(java_base / "dledger-n0")) == (2, "n0")
    store.close()

    ours = tmp_path / "pymq"
    mine = DLedgerFileStore(_config(ours))
    mine.open()
    for i in range(150):
        mine.append_as_leader(_body(i), 2)
    mine.update_committed_index(120)
    mine.close()
    persist_term(str(ours / "dledger-n0"), 2, "n0")
    java_files = _files(java_base)
    assert len([name for name in java_files if name.startswith("data/")]) >= 3
    assert _files(ours) == java_files


def test_java_reads_a_store_pymq_wrote_and_truncated(java_classes, tmp_path) -> None:
    store = DLedgerFileStore(_config(tmp_path))
    store.open()
    for i in range(100):
        store.append_as_leader(_body(i), 1 + i // 40)
    store.truncate_after(90)
    # as a follower whose entry 91 differs from the new leader's
    for i in range(91, 95):
        store.append_as_leader(b"stale-%d" % i, 3)
    replacement = DLedgerEntry(91, 4, b"the leader's 91", store.get(91).pos)
    store.truncate(replacement)
    store.update_committed_index(91)
    expected = [store.get(i) for i in range(92)]
    store.close()
    persist_term(str(tmp_path / "dledger-n0"), 4, None)
    lines = _java(java_classes, "read", tmp_path, DATA_SIZE, INDEX_SIZE)
    assert lines[0] == "term 4 vote null"
    last = expected[-1]
    assert lines[1] == f"ledger 0 91 4 91 {last.pos + last.size}"
    assert lines[2:] == [
        f"entry {e.index} {e.term} {e.pos} {e.size} 1 {e.body.hex()}" for e in expected
    ]
