"""Line coverage of the Python twins of pymq's C functions by the twin-agreement tests.

Runs the test files that scripts/count_twin_tests.py counts (those that exist), and those whose
behavioural tests run on the C function and its twin alike (BOTH_WAYS), under coverage.py
twice, as built and with PYMQ_PURE_PYTHON=1, combines the two, and reports the statements of
each twin function's body (nested definitions included, its ``def`` line not), and of the
module's own functions it calls (transitively), that ran.  TWIN_COVERAGE_DATA=FILE reports on
a combined data file of an earlier run instead of running the tests.

    python scripts/twin_coverage.py [TEST_FILE ...]   (needs coverage: pip install coverage)
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
import tempfile

TWINS = {
    "pymq.common.message_ext": ["_properties_bytes_py", "_decode_properties_py",
                                "_java_string_hash_py", "_java_string_hash_after_py"],
    "pymq.common.message_id": ["_offset_msg_id_py", "_offset_msg_ids_py"],
    "pymq.common.record": ["_decode_plain_py", "_scan_plain"],
    "pymq.common.batch": ["decode_batch_py"],
    "pymq.common.clock": ["_now_ms_py"],
    "pymq.remoting.codec": ["_walk_frames", "busy_answers_py", "json_command_py",
                            "json_header_py", "send_fields_py", "send_answer_fields_py",
                            "send_run_fields_py"],
    "pymq.remoting.headers": ["send_header_py", "plain_header_py"],
    "pymq.store.get_message": ["_record_is_py"],
    "pymq.store.index_file": ["index_put_py"],
    "pymq.store.reput": ["record_hints_py", "dispatch_hinted_py"],
    "pymq.store.commitlog": ["encode_run_py"],
    "pymq.broker.processors.send": ["send_answer_frame_py", "send_answer_run_py"],
    "pymq.client.producer": ["send_frame_py", "batch_body_py"],
    "pymq.export.columns": ["export_columns_py"],
}  # fmt: skip


# Test files not counted as agreement tests whose tests assert answers of the C function and of
# its twin alike (parametrised over both): they exercise the twins too.
BOTH_WAYS = ["tests/unit/test_encode_run.py"]


def counted_files() -> list[str]:
    scope: dict = {"__name__": "counted"}
    with open(os.path.join(os.path.dirname(__file__), "count_twin_tests.py")) as f:
        source = f.read()
    # The lists only, not the count (it prints).
    tree = ast.parse(source)
    keep: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.Assign) and
            getattr(n.targets[0], "id", "") in ("WHOLE", "PARTS", "ALL_BUT")]  # fmt: skip
    exec(compile(ast.Module(keep, []), "count_twin_tests.py", "exec"), scope)
    files = [*scope["WHOLE"], *scope["PARTS"], *scope["ALL_BUT"], *BOTH_WAYS]
    return [f for f in files if os.path.exists(f)]


def with_callees(defs: dict[str, ast.FunctionDef], names: list[str]) -> list[str]:
    """``names`` and the module-level functions of ``defs`` they call, transitively."""
    out: list[str] = []
    todo = list(names)
    while todo:
        name = todo.pop(0)
        if name in out:
            continue
        out.append(name)
        for node in ast.walk(defs[name]):
            called = (
                node.func.id
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                else None
            )
            if called in defs and called not in out:
                todo.append(called)
    return out


def main() -> None:
    import coverage

    data = os.environ.get("TWIN_COVERAGE_DATA")
    if data is None:
        data = run(sys.argv[1:] or counted_files())
    cov = coverage.Coverage(data_file=data)
    cov.load()
    total = hit = 0
    for module, names in TWINS.items():
        mod = importlib.import_module(module)
        path = inspect.getsourcefile(mod)
        assert path is not None
        _, statements, _, missing, _ = cov.analysis2(path)
        with open(path) as f:
            tree = ast.parse(f.read())
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for name in with_callees(defs, names):
            node = defs[name]
            body = {s for s in statements if node.lineno < s <= (node.end_lineno or 0)}
            ran = body - set(missing)
            total += len(body)
            hit += len(ran)
            gone = sorted(body - ran)
            print(f"{len(ran):4}/{len(body):<4} {module}.{name}  missing: {gone}")
    print(f"{hit}/{total} = {100 * hit / total:.1f} %")


def run(files: list[str]) -> str:
    """The combined coverage data file of the tests run as built and pure."""
    import coverage

    tmp = tempfile.mkdtemp()
    for pure in ("", "1"):
        env = dict(os.environ, PYMQ_PURE_PYTHON=pure, COVERAGE_FILE=os.path.join(tmp, f"c{pure}"))
        cmd = [sys.executable, "-m", "coverage", "run", "--source=pymq", "-m", "pytest", "-q",
               "-p", "no:cacheprovider", *files]  # fmt: skip
        subprocess.run(cmd, env=env, check=False)
    cov = coverage.Coverage(data_file=os.path.join(tmp, "all"))
    cov.combine([os.path.join(tmp, "c"), os.path.join(tmp, "c1")])
    cov.save()
    return os.path.join(tmp, "all")


if __name__ == "__main__":
    main()
