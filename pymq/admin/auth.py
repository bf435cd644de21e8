"""The admin token: configured (``adminToken``), else generated once into the store's config dir.

The file ``<storePathRootDir>/config/adminToken`` is created at first start with mode 0600 and
reused afterwards, so the console address printed at start stays valid across restarts.
"""

from __future__ import annotations

import hmac
import os
import secrets

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
