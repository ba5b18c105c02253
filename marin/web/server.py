"""The HTTP layer: a threaded stdlib server answering GET and HEAD, nothing else."""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .pages import App, Response

ALLOWED_METHODS = ("GET", "HEAD")
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


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "marin-browse"
    sys_version = ""

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.command not in ALLOWED_METHODS:
            self._drain_body()
            self._send(
                Response(
                    405, b"405 method not allowed: this browser is read-only\n", "text/plain; charset=utf-8"
                ),
                extra={"Allow": ", ".join(ALLOWED_METHODS)},
            )
            self.close_connection = True
            return False
        if not self._host_allowed():
            self._send(Response(403, b"403 forbidden: unexpected Host header\n", "text/plain; charset=utf-8"))
            self.close_connection = True
            return False
        return True

    def _drain_body(self) -> None:
        """Read a refused request's body, so closing the socket does not reset the reply."""
        try:
            length = min(int(self.headers.get("Content-Length") or 0), MAX_DRAINED_BODY)
        except ValueError:
            length = 0
        if length > 0:
            self.rfile.read(length)

    def _host_allowed(self) -> bool:
        """A server on loopback answers only to loopback names (no DNS rebinding)."""
        if not self.server.loopback_only:
            return True
        host = self.headers.get("Host")
        if host is None:
            return True  # HTTP/1.0 clients may omit it; nothing to rebind
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
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the stdlib's name)
        if self.server.log_requests:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: App, log_requests: bool):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.app = app
        self.log_requests = log_requests
        self.loopback_only = _is_loopback(address[0])
        super().__init__(address, _Handler)


class BrowserServer:
    """The browser bound to its address (listening from construction on)."""

    def __init__(self, prefix: str, host: str = "127.0.0.1", port: int = 8765, log_requests: bool = False):
        self.app = App(prefix)
        self.httpd = _Server((host, port), self.app, log_requests)
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
    prefix: str, host: str = "127.0.0.1", port: int = 8765, log_requests: bool = False
) -> BrowserServer:
    """Bind the browser for `prefix` to host:port (0 = a free port); call `.serve_forever()`
    or `.start_in_thread()` on the result, `.url` says where it is."""
    return BrowserServer(prefix, host, port, log_requests)
