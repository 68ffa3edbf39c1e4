#!/usr/bin/env python3
"""Runs the PyPI OpAMP client (opentelemetry-opamp-client 0.5b0) against a server.

Usage: python_client.py --endpoint URL --out DIR [--service-name NAME] [--group G]
                        [--token T] [--interval S] [--timeout-ms MS] [--fail-config MSG]

Run it with the python of a virtual environment that has the client installed
(python3 -m venv V && V/bin/pip install opentelemetry-opamp-client==0.5b0).

It connects as an OpenTelemetry SDK would: identifying attribute service.name,
non-identifying host.name and agent.group (the server's group). Each new remote
configuration (by config_hash) is written to DIR/config.json as
{"instance_uid", "config_hash" (hex), "files": {name: {"content_type", "body"}}},
then acknowledged: APPLIED (or FAILED with --fail-config MSG) and its files reported
as the effective configuration, in one full-state message. DIR/instance_uid holds
the client's uid (UUID text) from the start; DIR/events.jsonl one line per event.
SIGTERM or SIGINT stops it after an AgentDisconnect, exit code 0.
"""

import argparse
import json
import os
import pathlib
import signal
import socket
import sys
import threading
import time
import uuid

from opentelemetry._opamp.agent import OpAMPAgent
from opentelemetry._opamp.callbacks import OpAMPCallbacks
from opentelemetry._opamp.client import OpAMPClient
from opentelemetry._opamp.proto import opamp_pb2


def write_atomic(path, text):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Recorder:
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()

    def event(self, name, **fields):
        line = json.dumps({"event": name, "time": time.time(), **fields})
        with self.lock, open(self.out / "events.jsonl", "a") as f:
            f.write(line + "\n")


class Callbacks(OpAMPCallbacks):
    def __init__(self, recorder, fail_message):
        self.recorder = recorder
        self.fail_message = fail_message
        self.seen = set()

    def on_connect(self, agent, client):
        self.recorder.event("connected")

    def on_connect_failed(self, agent, client, error):
        self.recorder.event("connect_failed", error=str(error))

    def on_error(self, agent, client, error_response):
        self.recorder.event(
            "error_response",
            type=int(error_response.type),
            message=error_response.error_message,
        )

    def on_message(self, agent, client, message):
        rc = message.remote_config
        if rc is None or rc.config_hash in self.seen:
            return
        self.seen.add(rc.config_hash)
        files = {
            name: {"content_type": f.content_type, "body": f.body.decode("utf-8", "replace")}
            for name, f in rc.config.config_map.items()
        }
        write_atomic(
            self.recorder.out / "config.json",
            json.dumps(
                {
                    "instance_uid": str(uuid.UUID(bytes=client._instance_uid)),
                    "config_hash": rc.config_hash.hex(),
                    "files": files,
                },
                indent=1,
            ),
        )
        if self.fail_message:
            status, error = opamp_pb2.RemoteConfigStatuses_FAILED, self.fail_message
        else:
            status, error = opamp_pb2.RemoteConfigStatuses_APPLIED, ""
            client.update_effective_config(
                {name: f.body for name, f in rc.config.config_map.items()}, "text/plain"
            )
        client.update_remote_config_status(
            remote_config_hash=rc.config_hash, status=status, error_message=error
        )
        # One message with the status and the effective configuration.
        agent.send(client.build_full_state_message())
        self.recorder.event("remote_config", config_hash=rc.config_hash.hex(), status=int(status))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", required=True, help="e.g. http://127.0.0.1:7080/v1/opamp")
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--service-name", default="python-opamp-test")
    p.add_argument("--group", default="")
    p.add_argument("--token", default="", help="sent as Authorization: Bearer TOKEN")
    p.add_argument("--interval", type=float, default=1.0, help="heartbeat seconds (client default 30)")
    p.add_argument("--timeout-ms", type=int, default=5000, help="request timeout (client default 1000)")
    p.add_argument("--fail-config", default="", metavar="MSG", help="report remote configs FAILED")
    args = p.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(args.out)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    non_identifying = {"host.name": socket.gethostname()}
    if args.group:
        non_identifying["agent.group"] = args.group
    client = OpAMPClient(
        endpoint=args.endpoint,
        headers=headers,
        timeout_millis=args.timeout_ms,
        agent_identifying_attributes={"service.name": args.service_name},
        agent_non_identifying_attributes=non_identifying,
    )
    write_atomic(args.out / "instance_uid", str(uuid.UUID(bytes=client._instance_uid)))
    agent = OpAMPAgent(
        interval=args.interval,
        callbacks=Callbacks(recorder, args.fail_config),
        client=client,
    )

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    agent.start()
    recorder.event("started", endpoint=args.endpoint)
    stop.wait()
    agent.stop(timeout=5)
    recorder.event("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
