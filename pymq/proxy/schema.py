"""The ``apache.rocketmq.v2`` protobuf messages, built by pymq from their field numbers.

RocketMQ 5's clients speak the messages of apache/rocketmq-apis (``definition.proto`` and
``service.proto``).  pymq declares the ones it serves below, in a subset of the ``.proto``
language (:data:`DEFINITION`, :data:`SERVICE` and the two well-known types
``google.protobuf.Timestamp`` and ``Duration``), turns each file into a
``descriptor_pb2.FileDescriptorProto`` (:func:`file_proto`), adds the files to a descriptor pool
of its own and takes the message classes from protobuf's ``message_factory``.  The broker thus
imports no client package (the official one configures its logging and brings grpcio on
import); only ``protobuf`` is needed, in either of its implementations (upb or pure Python).
The private pool keeps these classes apart from any other copy of the same names in the
process (a test's official client, for one).

The wire form is the official one field for field (number, type, label, proto3 presence):
tests/unit/test_grpc_schema.py compares every message here with the official client's
generated classes and round-trips populated instances between the two.  Names are as in the
official modules: ``definition.Message``, ``service.SendMessageRequest``, ``Code.OK``,
``definition.Encoding.GZIP`` and so on.  Left out: SyncLiteSubscription's messages (pymq
answers that RPC UNIMPLEMENTED); a field a client adds beyond these is kept as an unknown field.

The subset: ``enum E { NAME = N; ... }``; ``message M { FIELD...; oneof O { FIELD... } }``
where a field is ``[repeated|optional] TYPE name = N;`` or ``map<K, V> name = N;``; TYPE is a
scalar (``string bytes bool int32 int64 float``), an enum or message of the same package, or
``google.protobuf.Timestamp``/``Duration``.  ``optional`` is proto3's explicit presence (a
synthetic oneof ``_name``, as protoc makes it).
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.message import DecodeError

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
PACKAGE = "apache.rocketmq.v2"

TIMESTAMP = """
message Timestamp { int64 seconds = 1; int32 nanos = 2; }
"""

DURATION = """
message Duration { int64 seconds = 1; int32 nanos = 2; }
"""

DEFINITION = """
enum TransactionResolution { TRANSACTION_RESOLUTION_UNSPECIFIED = 0; COMMIT = 1; ROLLBACK = 2; }
enum TransactionSource { SOURCE_UNSPECIFIED = 0; SOURCE_CLIENT = 1; SOURCE_SERVER_CHECK = 2; }
enum Permission { PERMISSION_UNSPECIFIED = 0; NONE = 1; READ = 2; WRITE = 3; READ_WRITE = 4; }
enum FilterType { FILTER_TYPE_UNSPECIFIED = 0; TAG = 1; SQL = 2; }
enum AddressScheme { ADDRESS_SCHEME_UNSPECIFIED = 0; IPv4 = 1; IPv6 = 2; DOMAIN_NAME = 3; }
enum MessageType {
  MESSAGE_TYPE_UNSPECIFIED = 0; NORMAL = 1; FIFO = 2; DELAY = 3; TRANSACTION = 4; LITE = 5;
  PRIORITY = 6;
}
enum DigestType { DIGEST_TYPE_UNSPECIFIED = 0; CRC32 = 1; MD5 = 2; SHA1 = 3; }
enum ClientType {
  CLIENT_TYPE_UNSPECIFIED = 0; PRODUCER = 1; PUSH_CONSUMER = 2; SIMPLE_CONSUMER = 3;
  PULL_CONSUMER = 4; LITE_PUSH_CONSUMER = 5; LITE_SIMPLE_CONSUMER = 6;
}
enum Encoding { ENCODING_UNSPECIFIED = 0; IDENTITY = 1; GZIP = 2; }
enum Code {
  CODE_UNSPECIFIED = 0;
  OK = 20000;
  MULTIPLE_RESULTS = 30000;
  BAD_REQUEST = 40000; ILLEGAL_ACCESS_POINT = 40001; ILLEGAL_TOPIC = 40002;
  ILLEGAL_CONSUMER_GROUP = 40003; ILLEGAL_MESSAGE_TAG = 40004; ILLEGAL_MESSAGE_KEY = 40005;
  ILLEGAL_MESSAGE_GROUP = 40006; ILLEGAL_MESSAGE_PROPERTY_KEY = 40007;
  INVALID_TRANSACTION_ID = 40008; ILLEGAL_MESSAGE_ID = 40009; ILLEGAL_FILTER_EXPRESSION = 40010;
  ILLEGAL_INVISIBLE_TIME = 40011; ILLEGAL_DELIVERY_TIME = 40012; INVALID_RECEIPT_HANDLE = 40013;
  MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = 40014; UNRECOGNIZED_CLIENT_TYPE = 40015;
  MESSAGE_CORRUPTED = 40016; CLIENT_ID_REQUIRED = 40017; ILLEGAL_POLLING_TIME = 40018;
  ILLEGAL_OFFSET = 40019; ILLEGAL_LITE_TOPIC = 40020;
  UNAUTHORIZED = 40100;
  PAYMENT_REQUIRED = 40200;
  FORBIDDEN = 40300;
  NOT_FOUND = 40400; MESSAGE_NOT_FOUND = 40401; TOPIC_NOT_FOUND = 40402;
  CONSUMER_GROUP_NOT_FOUND = 40403; OFFSET_NOT_FOUND = 40404;
  REQUEST_TIMEOUT = 40800;
  PAYLOAD_TOO_LARGE = 41300; MESSAGE_BODY_TOO_LARGE = 41301; MESSAGE_BODY_EMPTY = 41302;
  PRECONDITION_FAILED = 42800;
  TOO_MANY_REQUESTS = 42900; LITE_TOPIC_QUOTA_EXCEEDED = 42901;
  LITE_SUBSCRIPTION_QUOTA_EXCEEDED = 42902;
  REQUEST_HEADER_FIELDS_TOO_LARGE = 43100; MESSAGE_PROPERTIES_TOO_LARGE = 43101;
  INTERNAL_ERROR = 50000; INTERNAL_SERVER_ERROR = 50001; HA_NOT_AVAILABLE = 50002;
  NOT_IMPLEMENTED = 50100;
  PROXY_TIMEOUT = 50400; MASTER_PERSISTENCE_TIMEOUT = 50401; SLAVE_PERSISTENCE_TIMEOUT = 50402;
  UNSUPPORTED = 50500; VERSION_UNSUPPORTED = 50501; VERIFY_FIFO_MESSAGE_UNSUPPORTED = 50502;
  FAILED_TO_CONSUME_MESSAGE = 60000;
}
enum Language {
  LANGUAGE_UNSPECIFIED = 0; JAVA = 1; CPP = 2; DOT_NET = 3; GOLANG = 4; RUST = 5; PYTHON = 6;
  PHP = 7; NODE_JS = 8; RUBY = 9; OBJECTIVE_C = 10; DART = 11; KOTLIN = 12;
}
enum QueryOffsetPolicy { BEGINNING = 0; END = 1; TIMESTAMP = 2; }

message FilterExpression { FilterType type = 1; string expression = 2; }
message RetryPolicy {
  int32 max_attempts = 1;
  oneof strategy {
    ExponentialBackoff exponential_backoff = 2;
    CustomizedBackoff customized_backoff = 3;
  }
}
message ExponentialBackoff {
  google.protobuf.Duration initial = 1; google.protobuf.Duration max = 2; float multiplier = 3;
}
message CustomizedBackoff { repeated google.protobuf.Duration next = 1; }
message Resource { string resource_namespace = 1; string name = 2; }
message SubscriptionEntry { Resource topic = 1; FilterExpression expression = 2; }
message Address { string host = 1; int32 port = 2; }
message Endpoints { AddressScheme scheme = 1; repeated Address addresses = 2; }
message Broker { string name = 1; int32 id = 2; Endpoints endpoints = 3; }
message MessageQueue {
  Resource topic = 1; int32 id = 2; Permission permission = 3; Broker broker = 4;
  repeated MessageType accept_message_types = 5;
}
message Digest { DigestType type = 1; string checksum = 2; }
message SystemProperties {
  optional string tag = 1;
  repeated string keys = 2;
  string message_id = 3;
  Digest body_digest = 4;
  Encoding body_encoding = 5;
  MessageType message_type = 6;
  google.protobuf.Timestamp born_timestamp = 7;
  string born_host = 8;
  optional google.protobuf.Timestamp store_timestamp = 9;
  string store_host = 10;
  optional google.protobuf.Timestamp delivery_timestamp = 11;
  optional string receipt_handle = 12;
  int32 queue_id = 13;
  optional int64 queue_offset = 14;
  optional google.protobuf.Duration invisible_duration = 15;
  optional int32 delivery_attempt = 16;
  optional string message_group = 17;
  optional string trace_context = 18;
  optional google.protobuf.Duration orphaned_transaction_recovery_duration = 19;
  optional DeadLetterQueue dead_letter_queue = 20;
  optional string lite_topic = 21;
  optional int32 priority = 22;
}
message DeadLetterQueue { string topic = 1; string message_id = 2; }
message Message {
  Resource topic = 1;
  map<string, string> user_properties = 2;
  SystemProperties system_properties = 3;
  bytes body = 4;
}
message Assignment { MessageQueue message_queue = 1; }
message Status { Code code = 1; string message = 2; }
message UA { Language language = 1; string version = 2; string platform = 3; string hostname = 4; }
message Settings {
  optional ClientType client_type = 1;
  optional Endpoints access_point = 2;
  optional RetryPolicy backoff_policy = 3;
  optional google.protobuf.Duration request_timeout = 4;
  oneof pub_sub { Publishing publishing = 5; Subscription subscription = 6; }
  UA user_agent = 7;
  Metric metric = 8;
}
message Publishing {
  repeated Resource topics = 1; int32 max_body_size = 2; bool validate_message_type = 3;
}
message Subscription {
  optional Resource group = 1;
  repeated SubscriptionEntry subscriptions = 2;
  optional bool fifo = 3;
  optional int32 receive_batch_size = 4;
  optional google.protobuf.Duration long_polling_timeout = 5;
  optional int32 lite_subscription_quota = 6;
  optional int32 max_lite_topic_size = 7;
}
message Metric { bool on = 1; optional Endpoints endpoints = 2; }
"""

SERVICE = """
message QueryRouteRequest { Resource topic = 1; Endpoints endpoints = 2; }
message QueryRouteResponse { Status status = 1; repeated MessageQueue message_queues = 2; }
message SendMessageRequest { repeated Message messages = 1; }
message SendResultEntry {
  Status status = 1; string message_id = 2; string transaction_id = 3; int64 offset = 4;
  string recall_handle = 5;
}
message SendMessageResponse { Status status = 1; repeated SendResultEntry entries = 2; }
message QueryAssignmentRequest { Resource topic = 1; Resource group = 2; Endpoints endpoints = 3; }
message QueryAssignmentResponse { Status status = 1; repeated Assignment assignments = 2; }
message ReceiveMessageRequest {
  Resource group = 1;
  MessageQueue message_queue = 2;
  FilterExpression filter_expression = 3;
  int32 batch_size = 4;
  optional google.protobuf.Duration invisible_duration = 5;
  bool auto_renew = 6;
  optional google.protobuf.Duration long_polling_timeout = 7;
  optional string attempt_id = 8;
}
message ReceiveMessageResponse {
  oneof content {
    Status status = 1; Message message = 2; google.protobuf.Timestamp delivery_timestamp = 3;
  }
}
message AckMessageEntry {
  string message_id = 1; string receipt_handle = 2; optional string lite_topic = 3;
}
message AckMessageRequest {
  Resource group = 1; Resource topic = 2; repeated AckMessageEntry entries = 3;
}
message AckMessageResultEntry {
  string message_id = 1; string receipt_handle = 2; Status status = 3;
}
message AckMessageResponse { Status status = 1; repeated AckMessageResultEntry entries = 2; }
message ForwardMessageToDeadLetterQueueRequest {
  Resource group = 1;
  Resource topic = 2;
  string receipt_handle = 3;
  string message_id = 4;
  int32 delivery_attempt = 5;
  int32 max_delivery_attempts = 6;
  optional string lite_topic = 7;
}
message ForwardMessageToDeadLetterQueueResponse { Status status = 1; }
message HeartbeatRequest { optional Resource group = 1; ClientType client_type = 2; }
message HeartbeatResponse { Status status = 1; }
message EndTransactionRequest {
  Resource topic = 1;
  string message_id = 2;
  string transaction_id = 3;
  TransactionResolution resolution = 4;
  TransactionSource source = 5;
  string trace_context = 6;
}
message EndTransactionResponse { Status status = 1; }
message PrintThreadStackTraceCommand { string nonce = 1; }
message ReconnectEndpointsCommand { string nonce = 1; }
message ThreadStackTrace { string nonce = 1; optional string thread_stack_trace = 2; }
message VerifyMessageCommand { string nonce = 1; Message message = 2; }
message VerifyMessageResult { string nonce = 1; }
message RecoverOrphanedTransactionCommand { Message message = 1; string transaction_id = 2; }
message NotifyUnsubscribeLiteCommand { string lite_topic = 1; }
message TelemetryCommand {
  optional Status status = 1;
  oneof command {
    Settings settings = 2;
    ThreadStackTrace thread_stack_trace = 3;
    VerifyMessageResult verify_message_result = 4;
    RecoverOrphanedTransactionCommand recover_orphaned_transaction_command = 5;
    PrintThreadStackTraceCommand print_thread_stack_trace_command = 6;
    VerifyMessageCommand verify_message_command = 7;
    ReconnectEndpointsCommand reconnect_endpoints_command = 8;
    NotifyUnsubscribeLiteCommand notify_unsubscribe_lite_command = 9;
  }
}
message NotifyClientTerminationRequest { optional Resource group = 1; }
message NotifyClientTerminationResponse { Status status = 1; }
message ChangeInvisibleDurationRequest {
  Resource group = 1;
  Resource topic = 2;
  string receipt_handle = 3;
  google.protobuf.Duration invisible_duration = 4;
  string message_id = 5;
  optional string lite_topic = 6;
  optional bool suspend = 7;
}
message ChangeInvisibleDurationResponse { Status status = 1; string receipt_handle = 2; }
message PullMessageRequest {
  Resource group = 1;
  MessageQueue message_queue = 2;
  int64 offset = 3;
  int32 batch_size = 4;
  FilterExpression filter_expression = 5;
  google.protobuf.Duration long_polling_timeout = 6;
}
message PullMessageResponse {
  oneof content { Status status = 1; Message message = 2; int64 next_offset = 3; }
}
message UpdateOffsetRequest {
  Resource group = 1; MessageQueue message_queue = 2; int64 offset = 3;
}
message UpdateOffsetResponse { Status status = 1; }
message GetOffsetRequest { Resource group = 1; MessageQueue message_queue = 2; }
message GetOffsetResponse { Status status = 1; int64 offset = 2; }
message QueryOffsetRequest {
  MessageQueue message_queue = 1;
  QueryOffsetPolicy query_offset_policy = 2;
  optional google.protobuf.Timestamp timestamp = 3;
}
message QueryOffsetResponse { Status status = 1; int64 offset = 2; }
message RecallMessageRequest { Resource topic = 1; string recall_handle = 2; }
message RecallMessageResponse { Status status = 1; string message_id = 2; }
"""

_F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "bool": _F.TYPE_BOOL,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "float": _F.TYPE_FLOAT,
}
_TOKEN = re.compile(r"\s*([A-Za-z_][\w.]*|\d+|[{}=;<>,])")


class SchemaError(ValueError):
    """A declaration outside the subset this module reads."""


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise SchemaError(f"unexpected text at {text[pos : pos + 20]!r}")
        out.append(match.group(1))
        pos = match.end()
    return out


class _Reader:
    """One ``.proto`` subset text, read into a FileDescriptorProto (see the module doc)."""

    def __init__(self, text: str, package: str, imported_enums: frozenset[str]) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.package = package
        # The full names of the enums in reach: the imported ones and this text's own.
        pairs = zip(self.tokens, self.tokens[1:], strict=False)
        self.enums = imported_enums | {f"{package}.{name}" for kw, name in pairs if kw == "enum"}

    def take(self, expected: str | None = None) -> str:
        if self.pos >= len(self.tokens):
            raise SchemaError(f"the text ends where {expected or 'more'} was expected")
        token = self.tokens[self.pos]
        self.pos += 1
        if expected is not None and token != expected:
            raise SchemaError(f"expected {expected!r}, found {token!r}")
        return token

    def peek(self) -> str:
        if self.pos >= len(self.tokens):
            raise SchemaError("the text ends inside a declaration")
        return self.tokens[self.pos]

    def read(self, proto: descriptor_pb2.FileDescriptorProto) -> None:
        while self.pos < len(self.tokens):
            kind = self.take()
            if kind == "enum":
                self.enum(proto.enum_type.add())
            elif kind == "message":
                self.message(proto.message_type.add())
            else:
                raise SchemaError(f"expected enum or message, found {kind!r}")

    def enum(self, proto: descriptor_pb2.EnumDescriptorProto) -> None:
        proto.name = self.take()
        self.take("{")
        while self.peek() != "}":
            value = proto.value.add(name=self.take())
            self.take("=")
            value.number = int(self.take())
            self.take(";")
        self.take("}")

    def message(self, proto: descriptor_pb2.DescriptorProto) -> None:
        proto.name = self.take()
        self.take("{")
        optional: list[descriptor_pb2.FieldDescriptorProto] = []
        while self.peek() != "}":
            if self.peek() == "oneof":
                self.take()
                index = len(proto.oneof_decl)
                proto.oneof_decl.add(name=self.take())
                self.take("{")
                while self.peek() != "}":
                    self.field(proto).oneof_index = index
                self.take("}")
                continue
            field = self.field(proto)
            if field.proto3_optional:
                optional.append(field)
        self.take("}")
        # protoc's synthetic oneofs for proto3 ``optional``: after the real ones, in field order.
        for field in optional:
            field.oneof_index = len(proto.oneof_decl)
            proto.oneof_decl.add(name="_" + field.name)

    def field(self, message: descriptor_pb2.DescriptorProto) -> descriptor_pb2.FieldDescriptorProto:
        field = message.field.add(label=_F.LABEL_OPTIONAL)
        if self.peek() == "map":
            self.map_field(message, field)
            return field
        if self.peek() in ("repeated", "optional"):
            if self.take() == "repeated":
                field.label = _F.LABEL_REPEATED
            else:
                field.proto3_optional = True
        self.set_type(field, self.take())
        field.name = self.take()
        self.take("=")
        field.number = int(self.take())
        self.take(";")
        return field

    def map_field(
        self, message: descriptor_pb2.DescriptorProto, field: descriptor_pb2.FieldDescriptorProto
    ) -> None:
        self.take("map")
        self.take("<")
        key = self.take()
        self.take(",")
        value = self.take()
        self.take(">")
        field.name = self.take()
        self.take("=")
        field.number = int(self.take())
        self.take(";")
        entry = message.nested_type.add(
            name="".join(part.capitalize() for part in field.name.split("_")) + "Entry"
        )
        entry.options.map_entry = True
        self.set_type(entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL), key)
        self.set_type(entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL), value)
        field.label = _F.LABEL_REPEATED
        field.type = _F.TYPE_MESSAGE
        field.type_name = f".{self.package}.{message.name}.{entry.name}"

    def set_type(self, field: descriptor_pb2.FieldDescriptorProto, name: str) -> None:
        if name in SCALARS:
            field.type = SCALARS[name]
            return
        full = name if name.startswith("google.protobuf.") else f"{self.package}.{name}"
        field.type = _F.TYPE_ENUM if full in self.enums else _F.TYPE_MESSAGE
        field.type_name = "." + full


def file_proto(
    name: str,
    package: str,
    text: str,
    dependency: tuple[str, ...] = (),
    imported_enums: frozenset[str] = frozenset(),
) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of ``text`` (the subset of the module doc), a proto3 file;
    ``imported_enums`` are the full names of the enums it uses from ``dependency``."""
    proto = descriptor_pb2.FileDescriptorProto(
        name=name, package=package, syntax="proto3", dependency=dependency
    )
    _Reader(text, package, imported_enums).read(proto)
    return proto


def build(
    definition_text: str = DEFINITION, service_text: str = SERVICE
) -> tuple[SimpleNamespace, SimpleNamespace]:
    """The ``definition`` and ``service`` namespaces (message classes and enum wrappers by
    name) of the two texts, in a descriptor pool of their own."""
    pool = descriptor_pool.DescriptorPool()
    files = [
        file_proto("google/protobuf/timestamp.proto", "google.protobuf", TIMESTAMP),
        file_proto("google/protobuf/duration.proto", "google.protobuf", DURATION),
    ]
    wkt = ("google/protobuf/timestamp.proto", "google/protobuf/duration.proto")
    definition = file_proto("apache/rocketmq/v2/definition.proto", PACKAGE, definition_text, wkt)
    enums = frozenset(f"{PACKAGE}.{e.name}" for e in definition.enum_type)
    service = file_proto(
        "apache/rocketmq/v2/service.proto",
        PACKAGE,
        service_text,
        (*wkt, definition.name),
        enums,
    )
    for proto in (*files, definition, service):
        pool.Add(proto)
    spaces = []
    for proto in (definition, service):
        found = pool.FindFileByName(proto.name)
        names: dict[str, Any] = {
            name: message_factory.GetMessageClass(desc)
            for name, desc in found.message_types_by_name.items()
        }
        names.update(
            (name, EnumTypeWrapper(desc)) for name, desc in found.enum_types_by_name.items()
        )
        spaces.append(SimpleNamespace(**names))
    return spaces[0], spaces[1]


definition, service = build()

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
