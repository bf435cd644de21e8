"""Lines of twin-agreement tests outside the send tier, at a git revision (default: the work tree).

Whole files: their every test compares two implementations of one function (C vs its Python
twin) or a fast path against the general path it must equal.  Mixed files: only the named
top-level definitions (test functions and the helpers/constants only they use), decorators
included.  The send tier's tests (test_send_answer, test_send_run_c, test_batch_fast_path,
test_single_put_paths, test_encode_singles, the integration send tests) are left out.

    python scripts/count_twin_tests.py [REVISION]
"""

from __future__ import annotations

import ast
import subprocess
import sys

rev = sys.argv[1] if len(sys.argv) > 1 else None
WHOLE = [
    "tests/unit/test_twins.py",
    "tests/store/test_dispatch_hinted_diff.py",
    "tests/store/test_record_hints.py",
    "tests/spark/test_columns.py",
    "tests/unit/test_client_frames.py",
]
PARTS = {
    "tests/unit/test_codec.py": [
        "_reference",
        "test_fast_json_path_answers_as_json_alone",
        "test_fast_json_path_edge_cases",
        "_frame_of",
        "_decoded_either_way",
        "_header_text",
        "test_json_header_in_c_reads_frames_as_the_general_decoder",
        "test_json_header_reads_frames_as_the_general_decoder",
        "test_json_header_in_c_on_damaged_headers",
        "test_json_header_on_damaged_headers",
        "SEND_HEADER",
        "damaged_send_header",
        "test_json_header_in_c_reads_the_plain_send_header",
        "test_json_header_reads_the_plain_send_header",
        "JSON_HEADER_EDGES",
        "test_json_header_in_c_edge_cases",
        "test_json_header_edge_cases",
    ],
    "tests/unit/test_headers.py": [
        "test_the_send_fast_path_agrees_with_the_generic_decoder",
        "_plain_or_odd",
        "_digits9",
        "test_the_send_headers_flags_in_c_read_as_python_reads_them",
        "_END_NAMES",
        "test_the_end_transaction_header_in_c_agrees_with_the_python_decoder",
        "_flagish",
        "test_the_end_transaction_header_in_c_reads_its_flag_as_python_does",
    ],
    "tests/unit/test_batch_encoding.py": [
        "reference",
        "test_batch_body_is_the_reference_writers",
        "_plain",
        "native_batch_body",
        "test_the_c_batch_body_is_the_python_writers",
        "test_the_c_batch_body_leaves_what_is_not_plain_to_python",
    ],
    "tests/unit/test_recordc.py": ["test_the_cpp_clients_send_header_is_read_in_c"],
    "tests/store/test_dispatch_hints.py": [
        "fill_varied",
        "test_dispatch_in_c_writes_what_the_python_loop_writes",
        "test_arrivals_are_reported_for_the_wanted_topics_only",
    ],
}


def text(path: str) -> str:
    if rev is None:
        with open(path) as f:
            return f.read()
    args = ["git", "show", f"{rev}:{path}"]
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


total = 0
for path in WHOLE:
    n = len(text(path).splitlines())
    print(f"{n:6} {path}")
    total += n
for path, names in PARTS.items():
    tree = ast.parse(text(path))
    n = 0
    for node in tree.body:
        name = getattr(node, "name", None)
        if name is None and isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            name = getattr(target, "id", None)
        if name in names:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            n += (node.end_lineno or node.lineno) - start + 1
    print(f"{n:6} {path} (parts)")
    total += n
print(f"{total:6} total")
