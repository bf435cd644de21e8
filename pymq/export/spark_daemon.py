"""Spark's Python worker daemon, importing PySpark from its installed package instead of a zip.

Spark starts each session's Python worker daemon (``python -m pyspark.daemon``) with its bundled
``python/lib/pyspark.zip`` and ``py4j-*-src.zip`` first on ``PYTHONPATH``.  Python keeps no
compiled code for modules imported from a zip, so every daemon start compiled PySpark's sources
again, and so did every worker it forked for the modules it imports after the fork: several
times slower than importing the installed package (``scripts/bench_export.py`` shows it).  That
time is paid by the first Python job of every Spark session (an export's Parquet tasks).

With ``spark.python.daemon.module`` set to this module (the export's own session does it,
:data:`DAEMON_CONFIG`), the daemon moves the zips to the end of ``sys.path`` before PySpark is
imported, when they are the ones inside the installed ``pyspark`` package (so the same release
as the installed code; py4j's only when the installed ``py4j`` is the zip's version), then runs
``pyspark.daemon`` as usual.  The workers it forks inherit the path.  Where the zips belong to
another Spark (a ``SPARK_HOME`` distribution beside a different pip install), nothing is moved.

Nothing is imported before the fork that PySpark itself leaves until after it (pyarrow and
pandas start threads when imported, and a process that forks must have none).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from collections.abc import Mapping
from types import MappingProxyType, ModuleType

DAEMON_MODULE = "pymq.export.spark_daemon"
DAEMON_CONFIG: Mapping[str, str] = MappingProxyType({"spark.python.daemon.module": DAEMON_MODULE})
"""The Spark settings that make a session's Python workers start from this module (static:
they count only for a session whose SparkContext they create)."""

_PY4J_ZIP = re.compile(r"py4j-(.+)-src\.zip")


def _installed(path: list[str], package: str) -> str | None:
    """The directory of ``package`` as installed in a (non-zip) ``path`` entry, first found."""
    for entry in path:
        if not entry or entry.endswith(".zip"):
            continue
        candidate = os.path.join(entry, package)
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    return None


def _py4j_version(directory: str) -> str | None:
    """The ``__version__`` of the py4j package in ``directory`` (read, not imported)."""
    try:
        with open(os.path.join(directory, "version.py"), encoding="utf-8") as f:
            found = re.search(r"""__version__\s*=\s*['"]([^'"]+)['"]""", f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one file (through links too); False if either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def prefer_installed(path: list[str]) -> list[str]:
    """``path`` with the zips Spark bundles inside the installed ``pyspark`` package moved to its
    end (py4j's only when the installed ``py4j`` is the same version); anything else unchanged.
    Without an installed ``pyspark`` (or with zips from elsewhere) ``path`` comes back as is."""
    pyspark_dir = _installed(path, "pyspark")
    if pyspark_dir is None:
        return list(path)
    py4j_dir = _installed(path, "py4j")
    py4j_version = _py4j_version(py4j_dir) if py4j_dir is not None else None
    lib = os.path.join(pyspark_dir, "python", "lib")

    def ours(entry: str) -> bool:
        if not entry.endswith(".zip") or not _same_file(os.path.dirname(entry), lib):
            return False
        name = os.path.basename(entry)
        py4j = _PY4J_ZIP.fullmatch(name)
        return name == "pyspark.zip" or (py4j is not None and py4j.group(1) == py4j_version)

    moved = [entry for entry in path if ours(entry)]
    return [entry for entry in path if entry not in moved] + moved


def load_daemon() -> ModuleType:
    """``pyspark.daemon``, imported with :func:`prefer_installed`'s path; should that fail
    (never seen: the package and its zip come from one wheel), with PySpark's own path and
    whatever of PySpark and py4j the first try left in ``sys.modules`` dropped."""
    original = list(sys.path)
    with contextlib.suppress(Exception):  # never keep the workers from starting
        sys.path[:] = prefer_installed(sys.path)
    try:
        return importlib.import_module("pyspark.daemon")
    except Exception:
        if sys.path == original:
            raise
    sys.path[:] = original
    for name in [n for n in sys.modules if n.split(".", 1)[0] in ("pyspark", "py4j")]:
        del sys.modules[name]
    return importlib.import_module("pyspark.daemon")


def main() -> None:
    load_daemon().manager()


if __name__ == "__main__":
    main()
