"""DLedger 0.2.6's response codes (``DLedgerResponseCode``) and the error that carries one."""

from __future__ import annotations

import enum


class ResponseCode(enum.IntEnum):
    """``io.openmessaging.storage.dledger.protocol.DLedgerResponseCode``, numbers as 0.2.6."""

    UNKNOWN = -1
    SUCCESS = 200
    TIMEOUT = 300
    METADATA_ERROR = 301
    NETWORK_ERROR = 302
    UNSUPPORTED = 303
    UNKNOWN_GROUP = 400
    UNKNOWN_MEMBER = 401
    UNEXPECTED_MEMBER = 402
    EXPIRED_TERM = 403
    NOT_LEADER = 404
    NOT_FOLLOWER = 405
    INCONSISTENT_STATE = 406
    INCONSISTENT_TERM = 407
    INCONSISTENT_INDEX = 408
    INCONSISTENT_LEADER = 409
    INDEX_OUT_OF_RANGE = 410
    UNEXPECTED_ARGUMENT = 411
    REPEATED_REQUEST = 412
    REPEATED_PUSH = 413
    DISK_ERROR = 414
    DISK_FULL = 415
    TERM_NOT_READY = 416
    FALL_BEHIND_TOO_MUCH = 417
    TAKE_LEADERSHIP_FAILED = 418
    INDEX_LESS_THAN_LOCAL_BEGIN = 419
    REQUEST_WITH_EMPTY_BODYS = 420
    INTERNAL_ERROR = 500
    TERM_CHANGED = 501
    WAIT_QUORUM_ACK_TIMEOUT = 502
    LEADER_PENDING_FULL = 503
    ILLEGAL_MEMBER_STATE = 504
    LEADER_NOT_READY = 505
    LEADER_TRANSFERRING = 506

    @classmethod
    def of(cls, code: int) -> ResponseCode:
        """The member for ``code``; UNKNOWN for a number 0.2.6 does not know (as its
        ``valueOf``)."""
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN


class DLedgerError(Exception):
    """A refused request or a store that cannot go on; ``code`` is the DLedgerResponseCode a
    peer is answered with (as DLedger's ``DLedgerException``)."""

    def __init__(self, code: ResponseCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
