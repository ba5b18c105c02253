"""A fault-injecting HTTP proxy for tests: put it in front of an S3 or GCS server on
127.0.0.1, point the clients at it, and a chosen share of requests fail the way object
stores fail in production.

    with FaultProxy(server.endpoint_url, fault_rate=0.1, seed=1) as proxy:
        env["AWS_ENDPOINT_URL"] = proxy.url    # or STORAGE_EMULATOR_HOST for GCS
        ...
        proxy.faults          # how many requests were failed, by kind
        proxy.requests        # how many requests were seen, by method (faulted ones too)

It is a reverse proxy: the client talks HTTP/1.1 to it as if it were the server, and it
forwards each request unchanged (same method, path, headers -- the Host header too, so
S3 signatures still verify) on a fresh connection to the server. A faulted request never
reaches the server, so what the client retries was not applied; that keeps a retried
conditional write from meeting itself (a real store can lose an answer after applying a
request, which this proxy does not imitate). The faults, chosen at random per request:

- `503`: an HTTP 503 answer (S3's `SlowDown` XML, or GCS's JSON error);
- `429`: an HTTP 429 answer ("too many requests");
- `reset`: the connection is reset (TCP RST) without an answer.

With `refuse_credentials=401` (or 403) every request is answered as the real service answers
a request whose credentials it refuses (GCS: its JSON error with reason "authError" or
"forbidden"; S3: `InvalidAccessKeyId` / `AccessDenied` XML), for servers that check none
(fake-gcs-server accepts any token, so only this can show what a refusal does).

Only loopback addresses are served and forwarded to. The proxy runs in threads of the
test process and stops when the `with` block ends.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import json
import random
import socket
import struct
import threading
import urllib.parse

FAULT_KINDS = ("503", "429", "reset")

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)


class FaultProxy:
    """A reverse proxy to `upstream` (http://127.0.0.1:PORT) failing `fault_rate` of requests."""

    def __init__(
        self,
        upstream: str,
        fault_rate: float = 0.0,
        seed: int | None = None,
        flavor: str = "s3",
        refuse_credentials: int | None = None,
    ):
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the fault proxy forwards to loopback servers only, not {upstream}")
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port or 80
        self.fault_rate = fault_rate
        self.flavor = flavor
        if refuse_credentials not in (None, 401, 403):
            raise ValueError(f"refuse_credentials is 401 or 403, not {refuse_credentials!r}")
        self.refuse_credentials = refuse_credentials
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.requests: collections.Counter[str] = collections.Counter()
        self.faults: collections.Counter[str] = collections.Counter()
        self.log: list[tuple[str, str, str]] = []
        """(method, path, outcome) per request: the status forwarded, or the fault's kind."""
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> FaultProxy:
        handler = type("FaultProxyHandler", (_Handler,), {"proxy": self})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        assert self._server is not None, "use the proxy in a with block"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- bookkeeping ----------------------------------------------------------------------
    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.faults.clear()
            self.log.clear()

    def _choose_fault(self, method: str) -> str | None:
        with self._lock:
            self.requests[method] += 1
            if self._random.random() >= self.fault_rate:
                return None
            kind = self._random.choice(FAULT_KINDS)
            self.faults[kind] += 1
            return kind

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.log.append((method, path, outcome))


class _Handler(http.server.BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect; and 100-continue

    def log_message(self, format, *args):  # noqa: A002 -- the base class's signature
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        body = self._body()  # read it whole first, so a fault never leaves it half-read
        if self.proxy.refuse_credentials:
            self.proxy._record(self.command, self.path, f"refused {self.proxy.refuse_credentials}")
            self._send_error(self.proxy.refuse_credentials)
            return
        fault = self.proxy._choose_fault(self.command)
        if fault == "reset":
            self.proxy._record(self.command, self.path, fault)
            # SO_LINGER with a zero timeout: close() sends RST, the client sees a reset.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if fault in ("503", "429"):
            self.proxy._record(self.command, self.path, fault)
            self._send_error(int(fault))
            return
        upstream = http.client.HTTPConnection(self.proxy.upstream_host, self.proxy.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
            self.proxy._record(self.command, self.path, str(answer.status))
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            length = answer.getheader("Content-Length")
            self.send_header(
                "Content-Length", length if self.command == "HEAD" and length else str(len(data))
            )
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    def _send_error(self, status: int) -> None:
        # The wording of each service's refusals, as their documentation shows them.
        if self.proxy.flavor == "gcs":
            reason, message = {
                401: ("authError", "Invalid Credentials"),
                403: ("forbidden", "caller does not have storage.objects.get access to the bucket"),
            }.get(status, ("backendError", "injected fault"))
            body = json.dumps(
                {
                    "error": {
                        "code": status,
                        "message": message,
                        "errors": [{"message": message, "reason": reason}],
                    }
                }
            ).encode()
            content_type = "application/json"
        else:
            code = {401: "InvalidAccessKeyId", 403: "AccessDenied", 503: "SlowDown"}.get(
                status, "TooManyRequests"
            )
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>injected fault</Message><RequestId>fault</RequestId></Error>"
            ).encode()
            content_type = "application/xml"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle  # noqa: N815
