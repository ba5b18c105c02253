"""The HTTP layer: a threaded stdlib server answering GET and HEAD, nothing else.

Limits, so bursts and idle clients cannot stall it:

- the listen backlog holds `LISTEN_BACKLOG` connections (a burst of a few hundred
  clients waits to be accepted instead of having its SYNs dropped);
- every connection has a socket timeout (`CONNECTION_TIMEOUT` seconds by default): a
  client that sends nothing, or stops reading, is dropped when it runs out;
- a request (its line, headers and any body a refused request is drained of) must arrive
  whole within that same time, counted from when the server starts waiting for it: a
  client trickling a byte now and then is dropped too, so slow clients cannot hold
  every connection slot;
- at most `MAX_CONNECTIONS` connections are handled at once, one daemon thread each; a
  connection past that gets `503` at once and is closed.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .pages import App, Response

ALLOWED_METHODS = ("GET", "HEAD")
LISTEN_BACKLOG = 256
CONNECTION_TIMEOUT = 20.0
MAX_CONNECTIONS = 512
_BUSY_BODY = b"503 busy: too many connections, try again\n"
BUSY_RESPONSE = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)
MAX_DRAINED_BODY = 1 << 20
SECURITY_HEADERS = {
    # No scripts at all: the pages are plain HTML + inline SVG. Nothing is framed or fetched.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each given only the time left until `deadline` (time.monotonic()).

    A socket timeout alone bounds each read: a client sending a byte just before it runs
    out would keep one request coming forever.
    """

    def __init__(self, sock: socket.socket, timeout: float):
        self.sock = sock
        self.timeout = timeout
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(min(left, self.timeout))
        return self.sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "marin-browse"
    sys_version = ""

    def setup(self) -> None:
        self.timeout = self.server.connection_timeout  # StreamRequestHandler applies it to the socket
        super().setup()
        self.rfile.close()  # the socket's own reader: ours replaces it (the socket stays open)
        self._reader = _DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.timeout
        try:
            super().handle_one_request()
        finally:
            self._request_read()

    def _request_read(self) -> None:
        """Back to the plain socket timeout: the reply may take long to write to a slow reader."""
        if self._reader.deadline is not None:
            self._reader.deadline = None
            with contextlib.suppress(OSError):  # the client is gone: nothing left to read
                self.connection.settimeout(self.timeout)

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.command not in ALLOWED_METHODS:
            # The reply first, so a client that never sends the body it announced has it at
            # once; then the body is drained (within the request's time) so that closing the
            # socket does not reset the reply before the client reads it.
            self._send(
                Response(
                    405, b"405 method not allowed: this browser is read-only\n", "text/plain; charset=utf-8"
                ),
                extra={"Allow": ", ".join(ALLOWED_METHODS), "Connection": "close"},
            )
            self.wfile.flush()
            self._drain_body()
            self.close_connection = True
            return False
        self._request_read()
        if not self._host_allowed():
            self._send(Response(403, b"403 forbidden: unexpected Host header\n", "text/plain; charset=utf-8"))
            self.close_connection = True
            return False
        return True

    def _drain_body(self) -> None:
        """Read a refused request's body (at most `MAX_DRAINED_BODY` bytes, within the request's time)."""
        try:
            length = min(int(self.headers.get("Content-Length") or 0), MAX_DRAINED_BODY)
        except ValueError:
            length = 0
        try:
            while length > 0 and (chunk := self.rfile.read1(min(length, 65536))):
                length -= len(chunk)
        except OSError:  # TimeoutError included: the reply is sent, the connection closes
            pass

    def _host_allowed(self) -> bool:
        """A server on loopback answers only to loopback names (no DNS rebinding)."""
        if not self.server.loopback_only:
            return True
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:
            return False  # which one a proxy or client library honours is anyone's guess
        if not hosts:
            return True  # HTTP/1.0 clients may omit it; nothing to rebind
        host = hosts[0]
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return _is_loopback(name)

    def do_GET(self) -> None:
        self._send(self.server.app.handle(self.path))

    def do_HEAD(self) -> None:
        self._send(self.server.app.handle(self.path), head=True)

    def _send(self, response: Response, head: bool = False, extra: dict[str, str] | None = None) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        headers = {**SECURITY_HEADERS, **response.headers, **(extra or {})}
        for key, value in headers.items():
            self.send_header(key, value)
        if response.stream is None:
            self.send_header("Content-Length", str(len(response.body)))
        elif response.length is not None:
            self.send_header("Content-Length", str(response.length))
        self.end_headers()
        if head:
            return
        try:
            if response.stream is None:
                self.wfile.write(response.body)
            else:
                for chunk in response.stream():
                    self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):  # gone, or stopped reading
            self.close_connection = True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the stdlib's name)
        if self.server.log_requests:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        app: App,
        log_requests: bool,
        connection_timeout: float = CONNECTION_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.app = app
        self.log_requests = log_requests
        self.loopback_only = _is_loopback(address[0])
        self.connection_timeout = connection_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        """Answer 503 from the accepting thread without waiting on the client."""
        try:
            request.settimeout(0)
            request.send(BUSY_RESPONSE)  # fits a fresh socket's send buffer
        except OSError:
            pass
        self.shutdown_request(request)


class BrowserServer:
    """The browser bound to its address (listening from construction on)."""

    def __init__(
        self,
        prefix: str,
        host: str = "127.0.0.1",
        port: int = 8765,
        log_requests: bool = False,
        connection_timeout: float = CONNECTION_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.app = App(prefix)
        self.httpd = _Server((host, port), self.app, log_requests, connection_timeout, max_connections)
        self.host = host
        self.port = self.httpd.server_address[1]
        self._thread: threading.Thread | None = None
        self._serving = False

    @property
    def prefix(self) -> str:
        return self.app.prefix

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def serve_forever(self) -> None:
        self._serving = True
        try:
            self.httpd.serve_forever()
        finally:
            self._serving = False
            self.httpd.server_close()

    def start_in_thread(self) -> BrowserServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="marin-browse", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        if self._thread is not None or self._serving:
            self.httpd.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.httpd.server_close()


def start_server(
    prefix: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    log_requests: bool = False,
    connection_timeout: float = CONNECTION_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> BrowserServer:
    """Bind the browser for `prefix` to host:port (0 = a free port); call `.serve_forever()`
    or `.start_in_thread()` on the result, `.url` says where it is. `connection_timeout`
    (seconds) drops a client that sends or reads nothing for that long; `max_connections`
    bounds the connections (and threads) served at once."""
    return BrowserServer(prefix, host, port, log_requests, connection_timeout, max_connections)
