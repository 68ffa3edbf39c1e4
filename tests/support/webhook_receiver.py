#!/usr/bin/env python3
"""A webhook receiver for the end-to-end tests: checks each POST's X-Signature-256
(HMAC-SHA256 of the body with the secret, as GitHub signs), answers 401 when it is
wrong, 500 to the first --fail-first good ones, 204 to the rest, and appends one JSON
line per request to the log: its event, ids, whether the signature held, the answer,
and when it came (time.time()).

usage: webhook_receiver.py --port-file F --secret-file F --log F [--port N] [--fail-first N]
"""
import argparse
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", required=True)
    p.add_argument("--secret-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fail-first", type=int, default=0)
    args = p.parse_args()
    with open(args.secret_file, "rb") as f:
        secret = f.read().rstrip(b"\r\n")
    lock = threading.Lock()
    good = [0]
    log = open(args.log, "a", buffering=1)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            want = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
            got = self.headers.get("X-Signature-256", "")
            verified = hmac.compare_digest(want, got)
            try:
                event = json.loads(body)
            except ValueError:
                event = {}
            with lock:
                if not verified:
                    status = 401
                else:
                    good[0] += 1
                    status = 500 if good[0] <= args.fail_first else 204
                log.write(json.dumps({
                    "received": time.time(),
                    "verified": verified,
                    "status": status,
                    "header_id": self.headers.get("X-Event-Id", ""),
                    "id": event.get("id"),
                    "event": event.get("event"),
                    "fleet": event.get("fleet"),
                    "data": event.get("data"),
                }) + "\n")
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
