"""Consume-queue entry scanning in bulk agrees with the obvious loop."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from pymq.store.consume_queue import valid_entries

entries = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2**40, -1, -(2**62), 123456789]),
        st.sampled_from([1, 0, -5, 256, 2**31 - 1, -(2**31), 65536, 16777216]),
        st.integers(-(2**63), 2**63 - 1),
    ),
    max_size=60,
)


@given(entries, st.integers(0, 10))
def test_valid_entries_matches_loop(items, spare):
    buf = b"".join(struct.pack(">qiq", *e) for e in items) + bytes(20 * spare)
    expected = 0
    for offset, size, _ in items:
        if offset >= 0 and size > 0:
            expected += 1
        else:
            break
    assert valid_entries(buf, len(buf) // 20) == expected
