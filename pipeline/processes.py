"""Child processes llmslo starts (the embedded broker, its object store, demo parts)."""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["stop_process"]


def stop_process(process: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM ``process`` if it still runs; SIGKILL it if it has not exited within
    ``timeout_s``. Returns once it is reaped."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
