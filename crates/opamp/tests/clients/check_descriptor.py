#!/usr/bin/env python3
"""Compare the wire schema of crates/opamp/proto/opamp.proto with the real clients'.

Usage: check_descriptor.py OURS.fds [--python] [--node DIR]

OURS.fds is the FileDescriptorSet build.rs writes (target/*/build/agent-opamp-*/out/
opamp.fds). --python compares with the installed opentelemetry-opamp-client's
generated opamp_pb2 (run it with that virtual environment's python); --node DIR
with the descriptors embedded in DIR/node_modules/@elastic/opamp-client-node.

For every message and enum the client knows, every field must have the same number,
type and label as ours, and every enum value the same number. Names of packages
differ (the clients are generated from an older revision, package `opamp.proto`) and
do not travel on the wire. Exits 1 and lists the differences if any.
"""

import base64
import pathlib
import re
import sys

from google.protobuf import descriptor_pb2


def index(files):
    messages, enums = {}, {}

    def walk_message(prefix, m):
        name = prefix + m.name
        messages[name] = m
        for nested in m.nested_type:
            if nested.options.map_entry:
                continue
            walk_message(name + ".", nested)
        for e in m.enum_type:
            enums[name + "." + e.name] = e

    for f in files:
        for m in f.message_type:
            walk_message("", m)
        for e in f.enum_type:
            enums[e.name] = e
    return messages, enums


def short(type_name):
    return type_name.rsplit(".", 1)[-1] if type_name else ""


def compare(ours, theirs, who):
    our_msgs, our_enums = index(ours)
    their_msgs, their_enums = index(theirs)
    problems = []
    for name, tm in sorted(their_msgs.items()):
        om = our_msgs.get(name)
        if om is None:
            problems.append(f"{who}: message {name} missing from ours")
            continue
        our_fields = {f.name: f for f in om.field}
        for tf in tm.field:
            of = our_fields.get(tf.name)
            if of is None:
                problems.append(f"{who}: field {name}.{tf.name} = {tf.number} missing from ours")
                continue
            for attr in ("number", "type", "label"):
                if getattr(of, attr) != getattr(tf, attr):
                    problems.append(
                        f"{who}: {name}.{tf.name} {attr} ours {getattr(of, attr)} theirs {getattr(tf, attr)}"
                    )
            if short(of.type_name) != short(tf.type_name):
                problems.append(f"{who}: {name}.{tf.name} type ours {of.type_name} theirs {tf.type_name}")
            if of.HasField("oneof_index") != tf.HasField("oneof_index"):
                problems.append(f"{who}: {name}.{tf.name} oneof membership differs")
        for of in om.field:
            if of.name not in {f.name for f in tm.field}:
                print(f"{who}: note: {name}.{of.name} = {of.number} is newer than the client")
    for name, te in sorted(their_enums.items()):
        oe = our_enums.get(name)
        if oe is None:
            problems.append(f"{who}: enum {name} missing from ours")
            continue
        ours_by_name = {v.name: v.number for v in oe.value}
        for v in te.value:
            if ours_by_name.get(v.name) != v.number:
                problems.append(f"{who}: {name}.{v.name} ours {ours_by_name.get(v.name)} theirs {v.number}")
    checked = sum(len(m.field) for m in their_msgs.values())
    print(f"{who}: {len(their_msgs)} messages, {checked} fields, {len(their_enums)} enums compared")
    return problems


def python_files():
    from opentelemetry._opamp.proto import anyvalue_pb2, opamp_pb2

    out = []
    for mod in (anyvalue_pb2, opamp_pb2):
        fdp = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fdp)
        out.append(fdp)
    return out


def node_files(root):
    generated = pathlib.Path(root) / "node_modules/@elastic/opamp-client-node/lib/generated"
    out = []
    for name in ("anyvalue_pb.js", "opamp_pb.js"):
        text = (generated / name).read_text()
        encoded = re.search(r'fileDesc\("([^"]+)"', text).group(1)
        fdp = descriptor_pb2.FileDescriptorProto()
        # protobuf-es leaves out the padding.
        fdp.ParseFromString(base64.b64decode(encoded + "=" * (-len(encoded) % 4)))
        out.append(fdp)
    return out


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(pathlib.Path(argv[1]).read_bytes())
    ours = list(fds.file)
    problems = []
    args = argv[2:]
    if "--python" in args:
        problems += compare(ours, python_files(), "python")
    if "--node" in args:
        problems += compare(ours, node_files(args[args.index("--node") + 1]), "node")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
