"""A file-backed object store speaking the subset of the S3 API the embedded broker uses.

The bundled Tansu keeps its log in an object store (``--storage-engine s3://``); its
memory engine can neither delete records nor survive a restart, and its PostgreSQL engine
is not compiled in. This server keeps every object as a file under ``--root`` (bucket =
first directory), so the log outlives the broker, and the broker's owner can delete record
batches by deleting their files (:mod:`pipeline.broker`).

The subset: ``GET``/``HEAD`` of an object (with ``Range``), ``PUT`` with the conditional
headers Tansu relies on for its metadata (``If-None-Match: *``, ``If-Match: <etag>``;
412 when they fail), ``DELETE``, the batch ``DeleteObjects`` (``POST /<bucket>?delete``,
which Tansu sends to delete a topic) and ``ListObjectsV2`` by prefix. Request signatures
are not checked: it listens on loopback only.

Run as ``python pipeline/_objectstore.py --root DIR`` (a script: it imports nothing of
llmslo); it prints its port on the first
line of stdout.
"""

from __future__ import annotations

import argparse
import email.utils
import hashlib
import http.server
import os
import sys
import threading
import urllib.parse
from pathlib import Path
from xml.etree import ElementTree
from xml.sax.saxutils import escape

#: Name prefix of a file being written: never listed, renamed over its object when complete.
PARTIAL_PREFIX = ".partial-"

_put_lock = threading.Lock()  # a conditional PUT's check and rename are one step


def _etag(data: bytes) -> str:
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm on, the body
    # waits for the client's delayed ACK (40 ms), and a fetch that reads one batch per
    # object read ~20 batches a second.
    disable_nagle_algorithm = True
    root: Path
    sync = True

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would be the broker's whole log

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        url = urllib.parse.urlsplit(self.path)
        bucket, _, key = url.path.lstrip("/").partition("/")
        return (
            bucket,
            urllib.parse.unquote(key),
            urllib.parse.parse_qs(url.query, keep_blank_values=True),
        )

    def _file(self, bucket: str, key: str) -> Path | None:
        path = (self.root / bucket / key).resolve()
        return path if path.is_relative_to(self.root) else None

    def do_GET(self) -> None:
        bucket, key, query = self._target()
        if not key:
            return self._list(bucket, query.get("prefix", [""])[0])
        path = self._file(bucket, key)
        try:
            data = path.read_bytes() if path else b""
        except (FileNotFoundError, IsADirectoryError):
            path = None
        if path is None:
            return self._reply(404, b"<Error><Code>NoSuchKey</Code></Error>")
        headers = {
            "ETag": _etag(data),
            "Last-Modified": email.utils.formatdate(path.stat().st_mtime, usegmt=True),
        }
        byte_range = self.headers.get("Range")
        if byte_range and self.command == "GET":
            first, _, last = byte_range.removeprefix("bytes=").partition("-")
            start, end = int(first), int(last) if last else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._reply(206, data[start : end + 1], headers)
        self._reply(200, data, headers)

    do_HEAD = do_GET

    def _list(self, bucket: str, prefix: str) -> None:
        base = self.root / bucket
        directory = base / prefix.rpartition("/")[0]  # only the prefix's folder can match
        entries = []
        for folder, _, files in os.walk(directory):
            for name in files:
                path = Path(folder, name)
                key = path.relative_to(base).as_posix()
                if not name.startswith(PARTIAL_PREFIX) and key.startswith(prefix):
                    try:
                        entries.append((key, path.stat().st_size))
                    except FileNotFoundError:  # deleted by retention meanwhile
                        continue
        contents = "".join(
            f"<Contents><Key>{escape(key)}</Key><LastModified>1970-01-01T00:00:00.000Z"
            f"</LastModified><ETag>&quot;-&quot;</ETag><Size>{size}</Size></Contents>"
            for key, size in sorted(entries)
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(entries)}</KeyCount><IsTruncated>false</IsTruncated>"
            f"{contents}</ListBucketResult>"
        ).encode()
        self._reply(200, body, {"Content-Type": "application/xml"})

    def do_PUT(self) -> None:
        bucket, key, _ = self._target()
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self._file(bucket, key)
        if path is None or not key:
            return self._reply(400)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(PARTIAL_PREFIX + os.urandom(6).hex())
        # Written and synced before the lock: a sync takes ~10 ms, and the broker writes
        # three objects per record batch, so syncing under the lock capped every producer
        # together at a few dozen batches a second (the demo's taps fell ever further
        # behind). Concurrent syncs overlap; only the check and the rename are one step.
        with partial.open("wb") as out:
            out.write(data)
            out.flush()
            if self.sync:
                os.fsync(out.fileno())  # a record the producer saw acknowledged survives
        with _put_lock:
            exists = path.is_file()
            expected = self.headers.get("If-Match")
            if (self.headers.get("If-None-Match") == "*" and exists) or (
                expected and (not exists or _etag(path.read_bytes()) != expected)
            ):
                partial.unlink(missing_ok=True)
                return self._reply(412)
            os.replace(partial, path)
        self._reply(200, headers={"ETag": _etag(data)})

    def do_DELETE(self) -> None:
        bucket, key, _ = self._target()
        path = self._file(bucket, key)
        if path is not None:
            path.unlink(missing_ok=True)
        self._reply(204)

    def do_POST(self) -> None:
        bucket, key, query = self._target()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if key or "delete" not in query:
            return self._reply(501)
        try:
            request = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            return self._reply(400, b"<Error><Code>MalformedXML</Code></Error>")
        deleted = []
        # S3's namespace is optional in the request; match the element names either way.
        for element in request.iter():
            if element.tag.rpartition("}")[2] == "Key" and element.text:
                path = self._file(bucket, element.text)
                if path is not None:
                    path.unlink(missing_ok=True)  # deleting a missing key succeeds, as in S3
                deleted.append(element.text)
        result = "".join(f"<Deleted><Key>{escape(key)}</Key></Deleted>" for key in deleted)
        reply = f'<?xml version="1.0" encoding="UTF-8"?><DeleteResult>{result}</DeleteResult>'
        self._reply(200, reply.encode(), {"Content-Type": "application/xml"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--no-sync", action="store_true", help="skip fsync (a temporary log, gone at exit)"
    )
    args = parser.parse_args(argv)
    handler = type("Handler", (_Handler,), {"root": args.root.resolve(), "sync": not args.no_sync})
    server = http.server.ThreadingHTTPServer((args.host, 0), handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
