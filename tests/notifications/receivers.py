"""Real local endpoints: an HTTP server that records webhook posts, an SMTP server (aiosmtpd)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)  # when it arrived (the receiver's clock)


@dataclass
class WebhookReceiver:
    """Answers each POST with the next status in ``statuses`` (then 200), recording what came."""

    statuses: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)

    def start(self) -> WebhookReceiver:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                status = owner.statuses.pop(0) if owner.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MailServer:
    """aiosmtpd on a free loopback port; messages land in ``messages``."""

    def __init__(self) -> None:
        self.messages = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        self.messages.append(envelope)
        return "250 OK"

    def start(self) -> MailServer:
        from aiosmtpd.controller import Controller

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()
