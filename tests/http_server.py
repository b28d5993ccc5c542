"""A small HTTP file server for the remote tests: 127.0.0.1 only, Range/If-Range/ETag, PUT, and injected faults.

``SimpleHTTPRequestHandler`` ignores Range, so this one implements what the cache relies on: HEAD with
Content-Length and a strong ETag (of the file's content), ``Range: bytes=N-`` answered 206 unless ``If-Range``
names another ETag (then 200), and PUT to publish. Faults are queued per path and each is used once:

- ``("cut", n)``: send the first ``n`` bytes of the body, then drop the connection;
- ``("ignore-range",)``: answer a Range request with the whole file (200);
- ``("corrupt",)``: flip one byte of the body;
- ``("slow", seconds)``: wait before answering;
- ``("status", code)``: answer with that HTTP status (404, 500, ...);
- ``("throttle", seconds)``: send the body in 64 KiB pieces, waiting between them (a download to kill midway).

Faults apply to GET unless queued with ``method="HEAD"`` (or PUT). ``server.gets[path]`` counts GET requests per
path, ``server.ranges`` lists the Range headers received, and ``server.puts`` the paths uploaded, in order.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class FileServer(ThreadingHTTPServer):
    """Serves ``root`` on 127.0.0.1 (an ephemeral port) until :meth:`stop`."""

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = Path(root)
        self.faults: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        self.gets: dict[str, int] = defaultdict(int)
        self.ranges: list[tuple[str, str]] = []
        self.etags: dict[tuple[str, int, int], str] = {}
        self.puts: list[str] = []
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def fault(self, path: str, *fault: Any, method: str = "GET") -> None:
        """Queue a fault for the next ``method`` request of ``/path``."""
        with self.lock:
            self.faults["/" + path.lstrip("/")].append((method, *fault))

    def take_fault(self, path: str, method: str) -> tuple[Any, ...] | None:
        with self.lock:
            queue = self.faults.get(path, [])
            for k, fault in enumerate(queue):
                if fault[0] == method:
                    return queue.pop(k)[1:]
            return None

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FileServer
    _version: tuple[str, int, int] = ("", 0, 0)

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _content(self, read: bool = True) -> bytes | None:
        """The requested file's bytes (empty when not ``read``: HEAD needs only its version), or None after
        answering 404."""
        path = (self.server.root / self.path.split("?", 1)[0].lstrip("/")).resolve()
        if self.server.root.resolve() not in path.parents or not path.is_file():
            self.send_error(404)
            return None
        info = path.stat()
        self._version = (str(path), info.st_size, info.st_mtime_ns)
        return path.read_bytes() if read else b""

    def _etag(self, data: bytes | None = None) -> str:
        """A strong ETag of the content, remembered per file version (path, size, modification time): hashing every
        byte on every request would make the server, not the client, the thing measured."""
        key = self._version
        with self.server.lock:
            known = self.server.etags.get(key)
        if known is None:
            content = data if data is not None else Path(key[0]).read_bytes()
            known = '"' + hashlib.sha256(content).hexdigest()[:32] + '"'
            with self.server.lock:
                self.server.etags[key] = known
        return known

    def _faulted(self) -> tuple[Any, ...] | None:
        fault = self.server.take_fault(self.path, self.command)
        if fault and fault[0] == "slow":
            time.sleep(fault[1])
            return None
        if fault and fault[0] == "status":
            self.send_response(fault[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return ("answered",)
        return fault

    def do_HEAD(self) -> None:
        if self._faulted():
            return
        if self._content(read=False) is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(self._version[1]))
        self.send_header("ETag", self._etag())
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.gets[self.path] += 1
        fault = self._faulted()
        data = None if fault == ("answered",) else self._content()
        if data is None:
            return
        etag = self._etag(data)
        start = 0
        ranged = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if ranged:
            with self.server.lock:
                self.server.ranges.append((self.path, ranged))
        honoured = not (fault and fault[0] == "ignore-range")
        if ranged and ranged.startswith("bytes=") and (if_range is None or if_range == etag) and honoured:
            start = int(ranged[len("bytes=") :].split("-", 1)[0])
        body = data[start:]
        if fault and fault[0] == "corrupt" and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if fault and fault[0] == "cut":
            self.wfile.write(body[: fault[1]])
            self.wfile.flush()
            self.connection.shutdown(2)  # the connection drops mid-body
            return
        if fault and fault[0] == "throttle":
            for at in range(0, len(body), 1 << 16):
                self.wfile.write(body[at : at + (1 << 16)])
                self.wfile.flush()
                time.sleep(fault[1])
            return
        self.wfile.write(body)

    def do_PUT(self) -> None:
        if self._faulted():
            return
        length = int(self.headers.get("Content-Length", "0"))
        data = self.rfile.read(length)
        target = (self.server.root / self.path.lstrip("/")).resolve()
        if self.server.root.resolve() not in target.parents:
            self.send_error(403)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        with self.server.lock:
            self.server.puts.append(self.path)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()
