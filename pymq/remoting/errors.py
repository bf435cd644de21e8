"""Exceptions of the remoting layer."""

from __future__ import annotations


class RemotingError(Exception):
    """Base class of every remoting failure."""


class ProtocolError(RemotingError):
    """A peer sent bytes that are not a valid RocketMQ frame; its connection must be closed."""


class RemotingCommandError(RemotingError):
    """A well-framed request whose header lacks a field or carries a value of the wrong form."""


class RemotingConnectError(RemotingError):
    """Could not connect to an address, or the connection closed before the answer came."""


class RemotingTimeoutError(RemotingError):
    """No response arrived within the call's timeout."""


class RemotingSendError(RemotingError):
    """The request could not be written to the connection."""
