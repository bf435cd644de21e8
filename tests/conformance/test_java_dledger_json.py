"""The DLedger bodies the protocol unit tests hold as Java's (JAVA_BODIES in
tests/unit/test_dledger_protocol.py) are what DLedger 0.2.6 and fastjson 1.2.69 write today:
java/DLedgerJsonSamples.java builds the same objects and prints them.

Needs the Java build (/work/shared/java/README.md); skipped otherwise.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

from tests.unit.test_dledger_protocol import JAVA_BODIES

RMQ_BUILD = pathlib.Path(os.environ.get("RMQ_BUILD", "/tmp/rmqjava494"))
CLASSPATH = RMQ_BUILD / "lib" / "full.classpath"
SOURCE = pathlib.Path(__file__).parent / "java" / "DLedgerJsonSamples.java"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CLASSPATH.exists() or shutil.which("javac") is None,
        reason=f"DLedger 0.2.6 is not built ({CLASSPATH} missing, or no javac): "
        "see /work/shared/java/README.md",
    ),
]


def test_the_unit_tests_java_bodies_are_javas(tmp_path) -> None:
    classpath = CLASSPATH.read_text().strip()
    args = ["javac", "-nowarn", "-cp", classpath, "-d", str(tmp_path), str(SOURCE)]
    done = subprocess.run(args, capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    run = ["java", "-Xmx128m", "-cp", f"{tmp_path}:{classpath}", "DLedgerJsonSamples"]
    done = subprocess.run(run, capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout.decode().splitlines() == [java for _, java in JAVA_BODIES]
