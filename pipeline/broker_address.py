"""The embedded broker's address file: how the processes of one pipeline find its broker.

The process that starts a pipeline's embedded broker (``llmslo run``, ``llmslo broker``,
``llmslo ingest``) writes ``<store.path>.kafka`` beside the DuckDB file: one JSON object
with the bootstrap address, the owner's pid and command. It removes the file when the
broker stops. A process given no bootstrap servers reads it (:func:`read_address`) and
joins that broker. A file whose pid no longer runs (its owner was killed) is stale:
readers ignore it and the next owner replaces it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ADDRESS_SUFFIX", "BrokerAddress", "address_file", "published_address", "read_address"]

log = logging.getLogger(__name__)

#: The address file's name is the DuckDB file's name plus this.
ADDRESS_SUFFIX = ".kafka"


class BrokerAddress(BaseModel):
    """What an address file holds: where the broker listens and which process owns it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str
    pid: int
    command: str

    @property
    def alive(self) -> bool:
        """Whether the owner's process still runs (on this host; pids are not reused fast)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: it runs
            return True
        return True


def address_file(store_path: Path) -> Path:
    """The address file of the pipeline whose DuckDB file is ``store_path``."""
    return store_path.with_name(store_path.name + ADDRESS_SUFFIX)


def read_address(path: Path) -> BrokerAddress | None:
    """The address in ``path``; ``None`` when there is no file or it cannot be read (a
    file that is not an address file is logged and ignored). Check :attr:`BrokerAddress.alive`:
    a file left by a killed owner is returned too."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the broker address file %s: %s", path, exc)
        return None
    try:
        return BrokerAddress.model_validate_json(text)
    except ValidationError as exc:
        log.warning("ignoring %s: not a broker address file (%s)", path, exc.errors()[0]["msg"])
        return None


@contextlib.contextmanager
def published_address(path: Path, bootstrap_servers: str, command: str) -> Iterator[bool]:
    """Write ``path`` for the block's duration and remove it at exit; yields whether it was
    written. A file whose owner still runs is left alone (that broker stays the one to
    join; yields False); a stale one is replaced. The file is replaced atomically, mode
    ``0o666`` less the umask, so every process of the pipeline's user can read it."""
    current = read_address(path)
    if current is not None and current.alive and current.pid != os.getpid():
        log.warning(
            "%s names the broker of %s (pid %d) at %s: left as it is",
            path,
            current.command,
            current.pid,
            current.bootstrap_servers,
        )
        yield False
        return
    mine = BrokerAddress(bootstrap_servers=bootstrap_servers, pid=os.getpid(), command=command)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(mine.model_dump_json() + "\n")
    os.replace(partial, path)
    try:
        yield True
    finally:
        if read_address(path) == mine:  # not replaced by a later owner meanwhile
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
