"""An S3 endpoint without conditional writes, for tests: an HTTP proxy on 127.0.0.1 in front of
the test kit's S3Proxy (:class:`~exactly.testing.s3_server.S3Server`) that makes it behave
like the S3-compatible stores whose compare-and-swap is not real.

Two behaviours (:class:`Conditions`), the two ways such stores fail:

* :attr:`Conditions.IGNORED` -- the request headers ``If-None-Match`` and ``If-Match`` are
  removed, the request is signed again (boto3 signs those headers; AWS signature v4 with the
  server's key pair) and forwarded: S3Proxy then writes unconditionally, as a store that
  ignores the headers does (older MinIO, Ceph RGW and other S3-compatibles). The bytes still
  go to the real server; only the condition is lost. The dangerous case: every create and
  every swap "succeeds".
* :attr:`Conditions.REFUSED` -- a request carrying either header is answered ``501
  NotImplemented`` (its body read and dropped) and never reaches the server.

Every other request is forwarded unchanged (its original signature still holds: the proxy
sends the client's ``Host``). ``Expect: 100-continue`` is answered by the proxy itself
(:mod:`http.server`), and not forwarded. Bodies are read by their ``Content-Length`` (boto3
sends one); a chunked request body is answered ``400``.
:attr:`S3WithoutConditions.conditions_seen` counts the requests that carried a condition, so
a test can show the proxy was on the path.

Point clients at it with ``AWS_ENDPOINT_URL=`` :attr:`S3WithoutConditions.endpoint`; the
fixtures ``s3_ignoring_conditions`` and ``s3_refusing_conditions`` of
:mod:`exactly.testing.pytest_plugin` do.
"""

from __future__ import annotations

import http.client
import threading
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from exactly.testing.s3_server import S3Server

#: the conditional request headers of S3's create-if-absent and compare-and-swap
CONDITION_HEADERS = ("if-none-match", "if-match")
#: headers of one hop, never forwarded (``Host`` is: a re-signed request gets the upstream's)
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
        "upgrade", "expect"}
_NOT_IMPLEMENTED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented'
                    b"</Code><Message>A header you provided implies functionality that is not "
                    b"implemented</Message></Error>")


class Conditions(str, Enum):
    IGNORED = "ignored"  # stripped: the server overwrites unconditionally
    REFUSED = "refused"  # 501 NotImplemented


class S3WithoutConditions:
    """A proxy on 127.0.0.1:``port`` in front of ``server`` whose conditional writes are
    ``conditions`` (ignored or refused). A context manager; :meth:`stop` closes it."""

    def __init__(self, server: S3Server, conditions: Conditions) -> None:
        self.server = server
        self.conditions = Conditions(conditions)
        self.conditions_seen = 0
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: the value of ``AWS_ENDPOINT_URL`` for its clients."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3WithoutConditions:
        if self._thread is None:
            self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,),
                                            name=f"s3-conditions-{self.conditions.value}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join()
            self._thread = None
        self._http.server_close()

    def __enter__(self) -> S3WithoutConditions:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _count(self) -> None:
        with self._lock:
            self.conditions_seen += 1

    def _signed_without_conditions(self, method: str, path: str, headers: dict[str, str],
                                   body: bytes) -> dict[str, str]:
        """``headers`` without the conditions, signed again (v4) for the upstream server."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        kept = {k: v for k, v in headers.items()
                if k.lower() not in (*CONDITION_HEADERS, "authorization", "host", "x-amz-date",
                                     "x-amz-content-sha256")}
        request: Any = AWSRequest(method=method, url=f"{self.server.endpoint}{path}",
                                  headers=kept, data=body)
        S3SigV4Auth(Credentials(self.server.access_key, self.server.secret_key), "s3",
                    self.server.region).add_auth(request)
        return dict(request.headers.items())


def _handler(proxy: S3WithoutConditions) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and "100 Continue" for boto3's PUTs

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _relay(self) -> None:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                self._answer(400, [], b"this test proxy reads Content-Length bodies only")
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if any(k.lower() in CONDITION_HEADERS for k in headers):
                proxy._count()
                if proxy.conditions is Conditions.REFUSED:
                    self._answer(501, [("Content-Type", "application/xml")], _NOT_IMPLEMENTED)
                    return
                headers = proxy._signed_without_conditions(self.command, self.path, headers,
                                                           body)
            upstream = http.client.HTTPConnection("127.0.0.1", proxy.server.port, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                response = upstream.getresponse()
                self._answer(response.status, response.getheaders(), response.read())
            finally:
                upstream.close()

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            """Send the answer whole, with a Content-Length of its own (a HEAD: the
            upstream's, and no body)."""
            self.send_response(status)
            length = str(len(body))
            for key, value in headers:
                if key.lower() == "content-length" and self.command == "HEAD":
                    length = value
                elif key.lower() not in (*_HOP, "content-length", "date", "server"):
                    self.send_header(key, value)
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

    return Handler
