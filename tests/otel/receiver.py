"""An OTLP/HTTP trace receiver for tests/otel.rs, decoding with the official protobuf
definitions (PyPI `opentelemetry-proto`).

It listens on 127.0.0.1 (an ephemeral port, printed as the first line of stdout), accepts
`POST /v1/traces` with an `ExportTraceServiceRequest` in protobuf, and keeps every request:
its path, its headers, its raw body (as latin-1 text, so that the test can look for any
string in what was sent) and its spans, decoded. `GET /dump` returns all of it as JSON.

    python3 receiver.py [ok|fail]

`fail` answers every export with 500 (a collector that refuses). Exits with code 3, saying
why, when `opentelemetry-proto` is not installed.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )
except ImportError as e:  # pragma: no cover - the test says SKIPPED
    print(f"opentelemetry-proto is not installed: {e}", file=sys.stderr)
    sys.exit(3)

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
LOCK = threading.Lock()
REQUESTS = []


def value(v):
    """An AnyValue as JSON."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def spans_of(req):
    out = []
    for rs in req.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": s.kind,
                        "start_ns": s.start_time_unix_nano,
                        "end_ns": s.end_time_unix_nano,
                        "status_code": s.status.code,
                        "status_message": s.status.message,
                        "attributes": attributes(s.attributes),
                        "resource": resource,
                        "scope": ss.scope.name,
                    }
                )
    return out


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        entry = {
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "raw": body.decode("latin-1"),
            "spans": [],
            "error": None,
        }
        try:
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            entry["spans"] = spans_of(req)
        except Exception as e:  # noqa: BLE001 - reported to the test
            entry["error"] = repr(e)
        with LOCK:
            REQUESTS.append(entry)
        if MODE == "fail":
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def do_GET(self):
        with LOCK:
            text = json.dumps({"requests": REQUESTS}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
