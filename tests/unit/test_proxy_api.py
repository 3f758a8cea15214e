"""The RocketMQ 5 API Orbit compiled (data_plane/proxy/v2) is the one the official clients speak:
every message, field (name, number, type, label, oneof), enum value and RPC compared with the
descriptors shipped in the official Python client (run in its own environment)."""

from __future__ import annotations

import base64
import json
import subprocess

from google.protobuf import descriptor_pb2

from data_plane.proxy.v2 import definition_pb2, service_pb2
from tests import rocketmq5_client

DUMP = """
import base64, json
from rocketmq.grpc_protocol import definition_pb2, service_pb2
print(json.dumps({m.__name__.rsplit(".", 1)[1]: base64.b64encode(m.DESCRIPTOR.serialized_pb).decode()
                  for m in (definition_pb2, service_pb2)}))
"""


def official() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    out = subprocess.run([str(rocketmq5_client.client_python()), "-c", DUMP], capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    return {
        k: descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(v)) for k, v in json.loads(out.stdout).items()
    }


def ours(module: object) -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fd)  # type: ignore[attr-defined]
    return fd


def shape(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, object]:
    """What the wire depends on, without file names and options."""

    def message(m: descriptor_pb2.DescriptorProto) -> dict[str, object]:
        return {
            "fields": sorted(
                (
                    f.name,
                    f.number,
                    f.type,
                    f.label,
                    f.type_name,
                    f.oneof_index if f.HasField("oneof_index") else -1,
                    f.proto3_optional,
                )
                for f in m.field
            ),
            "oneofs": [o.name for o in m.oneof_decl],
            "nested": {n.name: message(n) for n in m.nested_type},
            "enums": {e.name: sorted((v.name, v.number) for v in e.value) for e in m.enum_type},
        }

    return {
        "package": fd.package,
        "messages": {m.name: message(m) for m in fd.message_type},
        "enums": {e.name: sorted((v.name, v.number) for v in e.value) for e in fd.enum_type},
        "services": {
            s.name: sorted(
                (r.name, r.input_type, r.output_type, r.client_streaming, r.server_streaming) for r in s.method
            )
            for s in fd.service
        },
    }


def test_the_compiled_api_matches_the_official_clients_field_for_field() -> None:
    theirs = official()
    for name, module in (("definition_pb2", definition_pb2), ("service_pb2", service_pb2)):
        mine, reference = shape(ours(module)), shape(theirs[name])
        assert mine["package"] == reference["package"] == "apache.rocketmq.v2"
        assert mine == reference, name
    # Not vacuous: the service and the types the clients use are there.
    methods = {r[0] for r in shape(ours(service_pb2))["services"]["MessagingService"]}  # type: ignore[index]
    assert {"QueryRoute", "SendMessage", "ReceiveMessage", "AckMessage", "Telemetry", "RecallMessage"} <= methods
