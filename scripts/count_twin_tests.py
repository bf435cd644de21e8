"""Lines of twin-agreement tests, at a git revision (default: the work tree).

A twin-agreement test is one whose purpose is that two implementations of one function agree:
a C function and its Python twin, or a fast path and the general path it must equal.  Counted:
whole files (WHOLE: their every test is one), the named top-level definitions of mixed files
(PARTS: test functions and the helpers/constants only they use, decorators included), and
files counted whole but for named definitions (ALL_BUT: files whose few behavioural tests
are named there).  Tests of behaviour (a refusal, a leak, what Python code
run meanwhile may change) run under both builds and are not counted; nor are the integration
tests of the broker's send tiers (tests/integration/test_send_*.py), which compare whole
brokers' answers and stores end to end.

    python scripts/count_twin_tests.py [REVISION]
"""

from __future__ import annotations

import ast
import subprocess
import sys

rev = sys.argv[1] if len(sys.argv) > 1 else None
WHOLE = [
    "tests/store/test_record_hints.py",
]
PARTS = {
    "tests/unit/test_codec.py": [
        "_reference",
        "test_fast_json_path_edge_cases",
        "_frame_of",
        "_JSON_HEADER_READERS",
        "_decoded_either_way",
        "_header_text",
        "_json_scalars",
        "_json_values",
        "_int32",
        "_ANY_FIELDS",
        "_SOUND_TOP",
        "test_json_header_in_c_reads_frames_as_the_general_decoder",
        "test_json_header_reads_frames_as_the_general_decoder",
        "test_json_header_in_c_on_damaged_headers",
        "test_json_header_on_damaged_headers",
        "SEND_HEADER",
        "damaged_send_header",
        "test_json_header_in_c_reads_the_plain_send_header",
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
        "_flag",
        "_SOUND_SEND",
        "_outcome",
        "_same",
        "_SOME_ODD",
        "test_the_send_header_reads_as_the_generic_decoder",
        "_END",
        "_END_MORE",
        "_ODD",
        "test_the_end_transaction_header_reads_as_the_generic_decoder",
    ],
    "tests/unit/test_batch_encoding.py": [
        "reference",
        "test_batch_body_is_the_reference_writers",
        "_plain",
        "WRITERS",
        "test_the_c_batch_body_is_the_python_writers",
    ],
    "tests/unit/test_recordc.py": [
        "test_the_cpp_clients_send_header_is_read_in_c",
        # The send answer's fast writer against the general one (json_response_frame).
        "test_send_answer_frame_is_json_response_frame",
        "test_send_answer_frame_writes_numbers_at_their_limits",
    ],
    # The fast send paths against the general path (same records, offsets and answers); the
    # set-up they share with the file's behavioural tests (what each path leaves to the
    # other, leaks, pwrite) is not counted, as for every PARTS file.
    "tests/store/test_batch_fast_path.py": [
        "_result",
        "_compare",
        "_NAME",
        "_VALUE",
        "_PROPS",
        "_ITEM",
        "_props_text",
        "_damaged",
        "_SEND",
        "test_fast_and_general_paths_store_the_same",
        "test_plain_cases_byte_for_byte",
    ],
    # Before encode_run (encode_singles against encode_single one by one): gone since.
    "tests/unit/test_encode_singles.py": [
        "PROPERTY",
        "ENTRY",
        "one_by_one",
        "run",
        "test_a_run_writes_what_encode_single_writes_one_by_one",
    ],
    "tests/store/test_dispatch_hints.py": [
        "fill_varied",
        "test_dispatch_in_c_writes_what_the_python_loop_writes",
        "test_arrivals_are_reported_for_the_wanted_topics_only",
    ],
}

ALL_BUT = {
    # What the frame writer (C, or its twin) declines, and the body types it takes.
    "tests/unit/test_client_frames.py": [
        "test_the_c_frame_writer_declines_what_python_writes",
        "test_the_send_frame_takes_a_body_of_any_bytes_like_type",
    ],
    # record_hints as built on a misplaced or blank record: the answer itself.
    "tests/store/test_dispatch_hinted_diff.py": [
        "test_a_misplaced_or_blank_record_is_not_read_back"
    ],
    # The stubs' names: no comparison.
    "tests/unit/test_twins.py": ["test_c_module_has_a_stub_naming_its_functions"],
    # export_columns alone (C, or its twin under PYMQ_PURE_PYTHON=1): where it stops, what it
    # hands inflate, that it reads inside any bytes, FAILFAST; and _runs, their helper.
    "tests/spark/test_columns.py": [
        "test_export_columns_hands_compressed_bodies_to_inflate",
        "test_failfast_raises_on_the_c_path_too",
        "_runs",
        "test_export_columns_stops_where_it_must",
        "test_export_columns_stays_inside_any_bytes",
    ],
    # The frames of ROWS, each with the fields (or None) both readers must give.
    "tests/unit/test_send_answer.py": [
        "test_raw_send_answers_give_the_fields_to_calls_that_take_them",
        "_changed",
        "ROWS",
        "test_answers_are_read_or_left_to_the_usual_path",
    ],
    "tests/unit/test_send_run_c.py": [
        "test_the_frame_readers_read_any_buffer_inside_its_bounds",
        "test_send_run_fields_stops_where_the_judge_says",
        "test_send_run_fields_refuses_bad_arguments_and_raises_what_the_judge_raises",
        "test_send_run_fields_leaks_nothing",
        "test_send_answer_run_refuses_what_it_cannot_write",
        "test_python_code_run_by_the_arguments_cannot_pull_them_away",
    ],
}


def text(path: str) -> str:
    if rev is None:
        with open(path) as f:
            return f.read()
    args = ["git", "show", f"{rev}:{path}"]
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def span(node: ast.stmt) -> int:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return (node.end_lineno or node.lineno) - start + 1


def named(node: ast.stmt) -> str | None:
    name = getattr(node, "name", None)
    if name is None and isinstance(node, (ast.Assign, ast.AnnAssign)):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        name = getattr(target, "id", None)
    return name


def exists(path: str) -> bool:
    try:
        text(path)
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


total = 0
for path in WHOLE:
    if not exists(path):
        continue
    n = len(text(path).splitlines())
    print(f"{n:6} {path}")
    total += n
for path, names in PARTS.items():
    if not exists(path):
        continue
    tree = ast.parse(text(path))
    n = sum(span(node) for node in tree.body if named(node) in names)
    print(f"{n:6} {path} (parts: {sum(named(node) in names for node in tree.body)} definitions)")
    total += n
for path, names in ALL_BUT.items():
    if not exists(path):
        continue
    source = text(path)
    tree = ast.parse(source)
    left_out = [node for node in tree.body if named(node) in names]
    n = len(source.splitlines()) - sum(span(node) for node in left_out)
    print(f"{n:6} {path} (all but {len(left_out)} behavioural tests)")
    total += n
print(f"{total:6} total")
