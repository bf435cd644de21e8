"""The ``apache.rocketmq.v2`` protobuf messages, from the published ``rocketmq-python-client``.

pymq keeps no copy of the ``.proto`` files or of generated code: the official Python 5.x client
(PyPI ``rocketmq-python-client``, the ``grpc`` extra) ships the generated modules as
``rocketmq.grpc_protocol``, and this module is the one place that imports them.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import definition_pb2 as definition
from rocketmq.grpc_protocol import service_pb2 as service

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"

Code = definition.Code
MessageType = definition.MessageType
Permission = definition.Permission
ClientType = definition.ClientType

__all__ = [
    "SERVICE_NAME",
    "ClientType",
    "Code",
    "DecodeError",
    "MessageType",
    "Permission",
    "definition",
    "service",
]
