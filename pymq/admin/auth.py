"""The admin token: configured (``adminToken``), else generated once into the store's config dir.

The file ``<storePathRootDir>/config/adminToken`` is created at first start with mode 0600 and
reused afterwards, so the console address printed at start stays valid across restarts.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections import OrderedDict
from collections.abc import Callable

from pymq.common.files import write_file_atomic

TOKEN_FILE_NAME = "adminToken"
# 32 random bytes, URL-safe: long enough that guessing is hopeless, short enough to paste.
TOKEN_BYTES = 32


def load_or_create_token(configured: str, config_dir: str) -> str:
    """Blocking: the configured token, or the one in ``config_dir`` (created when missing)."""
    if configured:
        return configured
    path = os.path.join(config_dir, TOKEN_FILE_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(TOKEN_BYTES)
    os.makedirs(config_dir, exist_ok=True)
    write_file_atomic(path, token.encode() + b"\n")
    os.chmod(path, 0o600)
    return token


def token_matches(expected: str, presented: object) -> bool:
    """Constant-time comparison; anything but a non-empty string is refused."""
    if not isinstance(presented, str) or not presented or not expected:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


class AuthThrottle:
    """Wrong tokens per client address, and the lockout they earn.

    Fewer than ``failures_before_delay`` (at least 1) wrong tokens from an address cost nothing
    (a typo); that many lock the address out for ``base_delay`` seconds, each further one for
    twice as long as the one before, at most ``max_delay``.  While an address is locked out
    every attempt is refused unchecked, the right token included, and without lengthening the
    lockout (so that a guesser on a shared address cannot lock the operator out for longer
    than ``max_delay``).  A right token outside a lockout forgets the address.  At most
    ``max_addresses`` addresses are remembered; beyond that the least recently failed one is
    forgotten.

    ``clock`` returns seconds (``trio.current_time`` in the channel, so tests can mock it).
    """

    def __init__(
        self,
        *,
        failures_before_delay: int,
        base_delay: float,
        max_delay: float,
        max_addresses: int,
        clock: Callable[[], float],
    ) -> None:
        self.failures_before_delay = failures_before_delay
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_addresses = max_addresses
        self._clock = clock
        # address -> (wrong tokens so far, locked out until); oldest failure first.
        self._entries: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try a token again (0: now)."""
        entry = self._entries.get(address)
        if entry is None:
            return 0.0
        return max(0.0, entry[1] - self._clock())

    def failed(self, address: str) -> float:
        """Count one wrong token from ``address``; return the lockout it starts (0: none)."""
        failures, _ = self._entries.pop(address, (0, 0.0))
        failures += 1
        over = failures - self.failures_before_delay
        delay = 0.0
        if over >= 0:
            # min() before the power would overflow: 2**over grows without bound.
            delay = self.max_delay if over >= 64 else min(self.max_delay, self.base_delay * 2**over)
        self._entries[address] = (failures, self._clock() + delay)
        while len(self._entries) > self.max_addresses:
            self._entries.popitem(last=False)
        return delay

    def succeeded(self, address: str) -> None:
        self._entries.pop(address, None)

    def __len__(self) -> int:
        return len(self._entries)
