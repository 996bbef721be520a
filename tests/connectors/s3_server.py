"""A local S3 (moto's WSGI app) behind a fault-injecting middleware, run as a subprocess by tests.

Usage: ``python tests/connectors/s3_server.py PORT``; prints ``ready`` once listening.

Faults are rules posted as JSON to ``/__faults__`` (a list of objects with ``kind``, ``method``
and ``path`` regexes, ``times``, and ``seconds`` for delays); ``POST /__faults__/reset`` clears
them and ``GET /__faults__/log`` returns how many requests each rule hit. Kinds:

* ``slowdown``: ``503 SlowDown`` (what S3 answers when throttling);
* ``denied``: ``403 AccessDenied``;
* ``delay``: sleep ``seconds`` then answer normally (a client timeout fires first);
* ``truncate``: send the headers and half of the body, then drop the connection.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

_ERROR = (
    "<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
)


class FaultInjector:
    """WSGI middleware applying the posted rules, in order, to matching requests."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.rules: list[dict[str, Any]] = []
        self.hits: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/__faults__"):
            return self._control(environ, start_response, path)
        rule = self._match(environ.get("REQUEST_METHOD", ""), path)
        if rule is None:
            return self.app(environ, start_response)
        kind = rule["kind"]
        if kind == "slowdown":
            return self._error(
                start_response, "503 Slow Down", "SlowDown", "Please reduce your request rate."
            )
        if kind == "denied":
            return self._error(start_response, "403 Forbidden", "AccessDenied", "Access Denied")
        if kind == "delay":
            time.sleep(float(rule.get("seconds", 2.0)))
            return self.app(environ, start_response)
        if kind == "truncate":
            return self._truncated(environ, start_response)
        raise ValueError(f"unknown fault kind {kind!r}")

    def _match(self, method: str, path: str) -> dict[str, Any] | None:
        with self.lock:
            for index, rule in enumerate(self.rules):
                if rule["times"] <= 0:
                    continue
                if re.search(rule.get("method", "."), method) and re.search(rule.get("path", "."), path):
                    rule["times"] -= 1
                    self.hits[index] += 1
                    return rule
        return None

    def _control(
        self, environ: dict[str, Any], start_response: Callable[..., Any], path: str
    ) -> Iterable[bytes]:
        with self.lock:
            if path.endswith("/reset"):
                self.rules, self.hits = [], []
            elif path.endswith("/log"):
                pass
            else:
                size = int(environ.get("CONTENT_LENGTH") or 0)
                for rule in json.loads(environ["wsgi.input"].read(size)):
                    rule.setdefault("times", 1)
                    self.rules.append(rule)
                    self.hits.append(0)
            body = json.dumps({"hits": self.hits}).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    @staticmethod
    def _error(start_response: Callable[..., Any], status: str, code: str, message: str) -> Iterable[bytes]:
        body = _ERROR.format(code=code, message=message).encode()
        start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    def _truncated(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured["status"], captured["headers"] = status, headers
            return lambda data: None

        body = b"".join(self.app(environ, capture))
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(body))))
        start_response(captured["status"], headers)

        def cut() -> Iterable[bytes]:
            yield body[: len(body) // 2]
            raise ConnectionAbortedError("fault injection: body cut mid-stream")

        return cut()


def main() -> None:
    """Serve on 127.0.0.1:PORT until killed."""
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    port = int(sys.argv[1])
    app = FaultInjector(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
