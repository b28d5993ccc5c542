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

Malicious behaviours (the attack suite, ``tests/test_security.py``); every loop is bounded and ends when the server
stops:

- ``("endless", announced)``: announce ``Content-Length: announced`` but send a chunked body that does not end (at
  most :data:`ENDLESS_LIMIT` bytes, or until the client hangs up);
- ``("stall", seconds)``: send the headers (the file's true length), then nothing for ``seconds`` (slowloris);
- ``("silent", seconds)``: accept the connection and send nothing at all for ``seconds``;
- ``("trickle", count, seconds)``: send the body ``count`` bytes at a time, waiting ``seconds`` between them;
- ``("huge", size)``: announce a ``size``-byte object and stream zeros (at most :data:`ENDLESS_LIMIT` bytes);
- ``("gzip",)``: send the file gzip-compressed with ``Content-Encoding: gzip`` (a bomb, for a crafted file);
- ``("redirect", location)``: answer 302 to ``location``.

``server.paths`` lists every request's raw path (query included) and ``server.auth`` its Authorization header;
DELETE removes a file (``server.deletes`` lists them). ``server.signatures`` (``{path: query}``) makes the server
private like a bucket behind presigned URLs: a request is answered only for a path listed there with its exact query
string, every other request gets 403.

Faults apply to GET unless queued with ``method="HEAD"`` (or PUT). ``server.gets[path]`` counts GET requests per
path, ``server.ranges`` lists the Range headers received, and ``server.puts`` the paths uploaded, in order.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: The most bytes an endless or huge body sends before the server gives up by itself.
ENDLESS_LIMIT = 256 << 20


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
        self.deletes: list[str] = []
        self.signatures: dict[str, str] = {}
        self.paths: list[str] = []
        self.auth: list[str | None] = []
        self.stopping = threading.Event()
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
        self.stopping.set()  # ends stalls and endless bodies under way
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

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less when the server stops."""
        self.server.stopping.wait(seconds)

    def _faulted(self) -> tuple[Any, ...] | None:
        with self.server.lock:
            self.server.paths.append(self.path)
            self.server.auth.append(self.headers.get("Authorization"))
        path = self.path.split("?", 1)[0]
        signature = self.server.signatures.get(path)
        if self.server.signatures and (signature is None or self.path != f"{path}?{signature}"):
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return ("answered",)
        fault = self.server.take_fault(path, self.command)
        if fault and fault[0] == "redirect":
            self.send_response(302)
            self.send_header("Location", fault[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return ("answered",)
        if fault and fault[0] == "silent":
            self._wait(fault[1])
            self.close_connection = True
            return ("answered",)
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
            self.server.gets[self.path.split("?", 1)[0]] += 1
        fault = self._faulted()
        if fault and fault[0] in ("endless", "huge"):
            self._endless(fault)
            return
        data = None if fault == ("answered",) else self._content()
        if data is None:
            return
        if fault and fault[0] == "gzip":
            data = gzip.compress(data)
        if fault and fault[0] == "stall":
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", self._etag())
            self.end_headers()
            self.wfile.flush()
            self._wait(fault[1])
            self.close_connection = True
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
        if fault and fault[0] == "gzip":
            self.send_header("Content-Encoding", "gzip")
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
        if fault and fault[0] == "trickle":
            try:
                for at in range(0, len(body), fault[1]):
                    if self.server.stopping.is_set():
                        break
                    self.wfile.write(body[at : at + fault[1]])
                    self.wfile.flush()
                    self._wait(fault[2])
            except OSError:  # the client gave up: what the test expects
                pass
            self.close_connection = True
            return
        if fault and fault[0] == "throttle":
            for at in range(0, len(body), 1 << 16):
                self.wfile.write(body[at : at + (1 << 16)])
                self.wfile.flush()
                time.sleep(fault[1])
            return
        self.wfile.write(body)

    def _endless(self, fault: tuple[Any, ...]) -> None:
        """An ``endless`` body (chunked, after announcing a small ``Content-Length``) or a ``huge`` one."""
        self.send_response(200)
        self.send_header("Content-Length", str(fault[1]))
        self.send_header("ETag", '"endless"')
        if fault[0] == "endless":
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        block = b"A" * (1 << 16)
        limit = ENDLESS_LIMIT if fault[0] == "endless" else min(fault[1], ENDLESS_LIMIT)
        sent = 0
        try:
            while sent < limit and not self.server.stopping.is_set():
                piece = block[: limit - sent]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if fault[0] == "endless" else piece)
                sent += len(piece)
        except OSError:  # the client hung up: what the test expects
            pass
        self.close_connection = True

    def do_DELETE(self) -> None:
        path = self.path.split("?", 1)[0]
        target = (self.server.root / path.lstrip("/")).resolve()
        if self.server.root.resolve() not in target.parents or not target.is_file():
            self.send_error(404)
            return
        target.unlink()
        with self.server.lock:
            self.server.deletes.append(path)
        self.send_response(204)
        self.end_headers()

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
