"""The broker address file: how processes started one by one find the same broker.

``llmslo run`` and ``llmslo broker`` start the embedded broker on a free port; they print
its address once and write it to :func:`address_file` (``var/broker.address`` under the
working directory, or ``$LLMSLO_BROKER_ADDRESS_FILE``), and remove the file when they stop.
Every other command that is given no ``--bootstrap-servers`` (and no ``bus.bootstrap_servers``
in its config) reads the file, so ``llmslo run`` in one terminal and ``llmslo collect`` in
another are one pipeline without copying an address. :func:`unreachable` is the quick TCP
check that lets a command refuse an address nobody answers at, instead of publishing into
the void (or into a private broker) while it reports success.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = [
    "ADDRESS_FILE_ENV",
    "DEFAULT_ADDRESS_FILE",
    "address_file",
    "read_address",
    "remove_address",
    "unreachable",
    "write_address",
]

#: Environment variable that moves the address file (one per checkout, per test session…).
ADDRESS_FILE_ENV = "LLMSLO_BROKER_ADDRESS_FILE"
DEFAULT_ADDRESS_FILE = Path("var/broker.address")


def address_file() -> Path:
    """Where the running broker's address is kept."""
    return Path(os.environ.get(ADDRESS_FILE_ENV) or DEFAULT_ADDRESS_FILE)


def write_address(address: str, path: Path | None = None) -> Path:
    """Write ``address`` (``HOST:PORT``) atomically; returns the file written."""
    target = path or address_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_text(address + "\n", encoding="utf-8")
    os.replace(partial, target)
    return target


def read_address(path: Path | None = None) -> str | None:
    """The address in the file, or ``None`` when there is no (or an empty) file."""
    try:
        text = (path or address_file()).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return text or None


def remove_address(address: str, path: Path | None = None) -> None:
    """Remove the file if it still names ``address`` (a newer broker may have replaced it)."""
    target = path or address_file()
    if read_address(target) == address:
        target.unlink(missing_ok=True)


def unreachable(bootstrap_servers: str, timeout_s: float = 2.0) -> list[str]:
    """The ``HOST:PORT`` entries of ``bootstrap_servers`` that refuse a TCP connection."""
    dead = []
    for entry in bootstrap_servers.split(","):
        host, _, port = entry.strip().rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                pass
        except OSError:
            dead.append(entry.strip())
    return dead
