"""The README's and the quick start's commands, as a newcomer runs them: the embedded default
(what `scripts/run` starts), a first send and receive with pymq's CLI, the Python example, and
the C++ client's example.  The commands are read from the pages themselves, so a page whose
commands stop working fails here; only the name server's address is changed to a free port."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_NAMESRV = "127.0.0.1:9876"

pytestmark = pytest.mark.slow


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)


def client_commands(page: Path) -> list[list[str]]:
    """The page's `.venv/bin/python -m pymq.client ...` lines, as argument lists."""
    commands = []
    for block in blocks(page, "sh"):
        for line in block.splitlines():
            if line.startswith(".venv/bin/python -m pymq.client "):
                words = re.findall(r'"[^"]*"|\S+', line.split("#")[0])
                commands.append([w.strip('"') for w in words[1:]])
    return commands


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory):
    """`python -m pymq` as `scripts/run` starts it (its last line), on free ports."""
    assert 'exec .venv/bin/python -m pymq "$@"' in (ROOT / "scripts" / "run").read_text()
    data = tmp_path_factory.mktemp("pymq-data")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pymq", "--data", str(data), "--bind", "127.0.0.1",
         "--namesrv-port", "0", "--broker-port", "0", "--admin-port", "0",
         "--metrics-port", "0", "--grpc-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        found = re.search(r"name server (127\.0\.0\.1:\d+)", banner)
        assert found, banner + (proc.stderr.read() if proc.poll() is not None else "")
        yield found.group(1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_python(argv: list[str], namesrv: str) -> subprocess.CompletedProcess[str]:
    argv = [namesrv if a == DEFAULT_NAMESRV else a for a in argv]
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_the_pages_first_send_and_receive(embedded: str, page: str) -> None:
    commands = client_commands(ROOT / page)
    assert [c[2] for c in commands] == ["send", "consume"], commands
    send, consume = commands
    body = send[send.index("--body") + 1]
    sent = run_python(send, embedded)
    assert sent.returncode == 0, sent.stderr
    assert "SEND_OK" in sent.stdout
    received = run_python(consume, embedded)
    assert received.returncode == 0, received.stderr
    assert body in received.stdout


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_the_pages_python_example(embedded: str, page: str) -> None:
    (example,) = [b for b in blocks(ROOT / page, "python") if "from pymq.client" in b]
    script = example.replace(DEFAULT_NAMESRV, embedded)
    if "trio.sleep(10)" in script:  # the consumer's demo wait, shortened
        script = script.replace("trio.sleep(10)", "trio.sleep(3)")
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "SEND_OK" in done.stdout


def test_the_quick_starts_cpp_client_example(embedded: str) -> None:
    pytest.importorskip("rocketmq.client", reason="the C++ client (PyPI rocketmq 0.4.4)")
    (example,) = [
        b for b in blocks(ROOT / "docs" / "quickstart.md", "python") if "rocketmq.client" in b
    ]
    done = subprocess.run(
        [sys.executable, "-c", example.replace(DEFAULT_NAMESRV, embedded)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"0 [0-9A-F]{32}\n", done.stdout), done.stdout  # SendStatus.OK, an id
