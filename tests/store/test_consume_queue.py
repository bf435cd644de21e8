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


def test_recover_with_stale_entries_after_a_zero_gap(tmp_path):
    from pymq.store.consume_queue import ConsumeQueue

    cq = ConsumeQueue("T", 0, str(tmp_path), 20 * 50)
    for i in range(10):
        assert cq.put(1000 + i * 100, 100, 7, i)
    mf = cq.queue.files[0]
    # entries 10..14 zero, then a stale entry (as a Java-written file may hold)
    struct.pack_into(">qiq", mf.mm, 15 * 20, 99999, 100, 7)
    cq.queue.close()
    again = ConsumeQueue("T", 0, str(tmp_path), 20 * 50)
    again.load()
    again.recover()
    assert again.max_offset_in_queue == 10
    assert again.max_physic_offset == 1000 + 9 * 100 + 100
    assert again.get_entry(9) == (1900, 100, 7) and again.get_entry(10) is None
    # the stale entry was zeroed with the dirty tail
    assert bytes(again.queue.files[0].mm[15 * 20 : 16 * 20]) == bytes(20)


async def test_flush_after_the_queue_directory_is_gone(tmp_path):
    """A new queue's directory is synced by its next flush (not on the loop); a queue deleted
    in between must not make that flush fail."""
    import shutil

    from pymq.store.consume_queue import ConsumeQueue

    cq = ConsumeQueue("T", 0, str(tmp_path), 20 * 1024)
    cq.put(0, 100, 0, 0)
    assert cq.queue._directory_dirty
    shutil.rmtree(tmp_path / "T")
    assert await cq.queue.flush(0)
    cq.queue.close()
