"""pymq's own ``apache.rocketmq.v2`` classes (:mod:`pymq.proxy.schema`) against the official
client's generated ones (issue #40): every message and enum pymq declares has the official
fields (name, number, type, label, presence, oneof), and a populated instance of each crosses
between the two unchanged, byte for byte, in both directions, with protobuf's upb and its pure
Python implementation alike."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from rocketmq.grpc_protocol import definition_pb2, service_pb2

from pymq.proxy import schema

# What the official modules hold and pymq leaves out (SyncLiteSubscription is UNIMPLEMENTED).
LEFT_OUT = {"SyncLiteSubscriptionRequest", "SyncLiteSubscriptionResponse", "OffsetOption"}
LEFT_OUT_ENUMS = {"LiteSubscriptionAction"}


def pairs(
    mine_spaces: tuple[Any, Any] = (schema.definition, schema.service),
) -> Iterator[tuple[str, Any, Any]]:
    """(name, pymq's class, the official class) for every message pymq declares."""
    for mine, theirs in zip(mine_spaces, (definition_pb2, service_pb2), strict=True):
        names = [n for n, v in vars(mine).items() if hasattr(v, "FromString")]
        assert names
        for name in names:
            yield name, getattr(mine, name), getattr(theirs, name)


def proto_of(desc: Descriptor) -> descriptor_pb2.DescriptorProto:
    proto = descriptor_pb2.DescriptorProto()
    desc.CopyToProto(proto)
    return proto


def shape(desc: Descriptor) -> list[str]:
    """A message's wire-relevant shape: every field with what decides its bytes."""
    proto = proto_of(desc)
    oneofs = [o.name for o in proto.oneof_decl]
    out = [f"nested {n.name} {n.options}" for n in proto.nested_type]
    for f in proto.field:
        oneof = oneofs[f.oneof_index] if f.HasField("oneof_index") else None
        out.append(str((f.name, f.number, f.type, f.label, f.type_name, f.proto3_optional, oneof)))
    for nested in desc.nested_types:
        out.extend(shape(nested))
    return sorted(out)


def test_every_declared_message_and_enum_is_the_official_one() -> None:
    seen = set()
    for name, mine, theirs in pairs():
        seen.add(name)
        assert mine.DESCRIPTOR.full_name == theirs.DESCRIPTOR.full_name
        assert shape(mine.DESCRIPTOR) == shape(theirs.DESCRIPTOR), name
    official = set(definition_pb2.DESCRIPTOR.message_types_by_name) | set(
        service_pb2.DESCRIPTOR.message_types_by_name
    )
    assert official - seen == LEFT_OUT
    for mine, theirs in ((schema.definition, definition_pb2), (schema.service, service_pb2)):
        enums = {n for n, v in vars(mine).items() if hasattr(v, "Name")}
        assert enums | LEFT_OUT_ENUMS >= set(theirs.DESCRIPTOR.enum_types_by_name)
        for name in enums:
            assert getattr(mine, name).items() == getattr(theirs, name).items(), name


def optional_fields(full_name: str) -> set[str]:
    """The proto3 ``optional`` fields of a message, from the official descriptor (a pool-built
    one has no serialized form to copy under pure-Python protobuf)."""
    official = descriptor_pool.Default().FindMessageTypeByName(full_name)
    return {f.name for f in proto_of(official).field if f.proto3_optional}


def populate(message: Any, choice: int, depth: int = 0) -> None:
    """Set every field of ``message`` (of each oneof, member ``choice`` modulo its size): a
    value of its own per field, and the zero value for a proto3 ``optional`` one (present all
    the same, so its presence must reach the wire)."""
    desc = message.DESCRIPTOR
    optional = optional_fields(desc.full_name)
    for field in desc.fields:
        oneof = field.containing_oneof
        chosen = oneof is None or oneof.fields[choice % len(oneof.fields)] is field
        if not chosen and field.name not in optional:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            mapping = getattr(message, field.name)
            mapping[f"{field.name}-k{depth}"] = f"v-{choice}"
            mapping["ключ"] = "значение"
            continue
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 4:
                continue
            if repeated:
                for i in range(2):
                    populate(getattr(message, field.name).add(), choice + i, depth + 1)
            else:
                sub = getattr(message, field.name)
                sub.SetInParent()
                if field.name not in optional:
                    populate(sub, choice, depth + 1)
            continue
        value = scalar(field, zero=field.name in optional)
        if repeated:
            getattr(message, field.name).extend([value, scalar(field, zero=True)])
        else:
            setattr(message, field.name, value)


def scalar(field: FieldDescriptor, zero: bool) -> Any:
    n = field.number
    kinds: dict[int, tuple[Any, Any]] = {
        FieldDescriptor.TYPE_STRING: ("", f"{field.name}-{n}-ü"),
        FieldDescriptor.TYPE_BYTES: (b"", bytes([0, 255, n])),
        FieldDescriptor.TYPE_BOOL: (False, True),
        FieldDescriptor.TYPE_INT32: (0, -(n * 1000 + 7)),  # negative: ten bytes on the wire
        FieldDescriptor.TYPE_INT64: (0, (1 << 40) + n),
        FieldDescriptor.TYPE_FLOAT: (0.0, 1.5 + n),
    }
    if field.type == FieldDescriptor.TYPE_ENUM:
        return 0 if zero else field.enum_type.values[-1].number
    return kinds[field.type][0 if zero else 1]


def instances(cls: Any) -> Iterator[Any]:
    """Populated instances of ``cls``, enough for every member of each of its oneofs."""
    widest = max([len(o.fields) for o in cls.DESCRIPTOR.oneofs] + [1])
    for choice in range(widest):
        message = cls()
        populate(message, choice)
        yield message


def same(a: Any, b: Any) -> bool:
    return text_format.MessageToString(a) == text_format.MessageToString(b)


def check_pair(name: str, mine: Any, theirs: Any) -> int:
    """Populated instances of one message from pymq's class to the official one and back, and
    from the official class to pymq's; the number of instances checked."""
    checked = 0
    for made, to in [(m, theirs) for m in instances(mine)] + [(m, mine) for m in instances(theirs)]:
        wire = made.SerializeToString(deterministic=True)
        other = to.FromString(wire)
        assert same(other, made), name  # an unknown or misread field shows here
        assert other.SerializeToString(deterministic=True) == wire, name
        checked += 1
    return checked


def check_round_trips() -> int:
    """Every declared message; the number of instances checked."""
    return sum(check_pair(*pair) for pair in pairs())


def test_populated_messages_cross_between_pymq_and_the_official_classes() -> None:
    assert check_round_trips() > 2 * len(list(pairs()))


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("string recall_handle = 5;", "string recall_handle = 6;"),  # a field number
        ("int64 offset = 4;", "int32 offset = 4;"),  # a type (the same for small values)
        ("optional string thread_stack_trace = 2;", "string thread_stack_trace = 2;"),  # presence
        ("optional int32 delivery_attempt = 16;", "int32 delivery_attempt = 16;"),
        ("repeated SendResultEntry entries = 2;", "SendResultEntry entries = 2;"),  # a label
        ("FAILED_TO_CONSUME_MESSAGE = 60000;", "FAILED_TO_CONSUME_MESSAGE = 60001;"),  # enum value
        ("bytes body = 4;", "string body = 4;"),
    ],
)
def test_a_wrong_declaration_is_seen_by_the_round_trip(text: str, wrong: str) -> None:
    texts = [schema.DEFINITION, schema.SERVICE]
    assert sum(t.count(text) for t in texts) == 1
    definition, service = (t.replace(text, wrong) for t in texts)
    spaces = schema.build(definition, service)
    failed = []
    for name, mine, theirs in pairs(spaces):
        try:
            check_pair(name, mine, theirs)
        except (AssertionError, ValueError):  # ValueError: a string field given bytes
            failed.append(name)
    assert failed


def test_a_message_fields_presence_is_checked_by_its_shape() -> None:
    # proto3 ``optional`` on a message field changes no byte, only the declared shape.
    wrong = schema.SERVICE.replace("optional Status status = 1;", "Status status = 1;")
    _, service = schema.build(service_text=wrong)
    mine, theirs = service.TelemetryCommand.DESCRIPTOR, service_pb2.TelemetryCommand.DESCRIPTOR
    assert shape(mine) != shape(theirs)


def test_text_outside_the_subset_is_refused() -> None:
    for bad in (
        "message M { string a = 1 }",
        "service S {}",
        "message M { oneof o { int32 a = 1; }",
    ):
        with pytest.raises(schema.SchemaError):
            schema.file_proto("bad.proto", "p", bad)


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["python", "upb"])
def test_either_protobuf_implementation_gives_the_same_bytes(implementation: str) -> None:
    code = (
        "from google.protobuf.internal import api_implementation as a\n"
        "from tests.unit.test_grpc_schema import check_round_trips\n"
        "print(a.Type(), check_round_trips())\n"
    )
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=implementation)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    kind, count = done.stdout.split()
    assert kind == implementation and int(count) > 50
