"""pymq.common.address: the strict reading of a configured address, the lenient one of a peer's."""

from __future__ import annotations

import pytest

from pymq.common.address import host_of, split_address


def test_split_address() -> None:
    assert split_address("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert split_address("[::1]:9876") == ("::1", 9876)
    for bad in ("127.0.0.1", ":9876", "host:port"):
        with pytest.raises(ValueError):
            split_address(bad)


def test_host_of_gives_what_a_4x_record_can_carry() -> None:
    assert host_of("10.0.0.7:53012") == ("10.0.0.7", 53012)
    assert host_of("[::ffff:10.0.0.7]:53012") == ("10.0.0.7", 53012)
    assert host_of("[::1]:53012") == ("127.0.0.1", 53012)  # IPv6 does not fit the record
    assert host_of(":53012") == ("127.0.0.1", 53012)
    assert host_of("10.0.0.7:x") == ("10.0.0.7", 0)  # never fails
