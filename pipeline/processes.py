"""Child processes llmslo starts (the embedded broker, its object store, demo parts)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from typing import Any

__all__ = ["die_with_parent", "stop_process"]


def die_with_parent(command: list[str], signal_name: str = "TERM") -> list[str]:
    """``command`` wrapped so the kernel sends it ``SIG<signal_name>`` when this process
    dies, however it dies (a killed test run must not leave brokers behind): util-linux's
    ``setpriv --pdeathsig``, which survives the exec.

    Unchanged where ``setpriv`` is missing (not Linux) or off the main thread: the kernel
    signals when the *thread* that started the child ends, and a worker thread's end is not
    the process's.
    """
    setpriv = shutil.which("setpriv")
    if (
        setpriv is None
        or not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return command
    return [setpriv, f"--pdeathsig={signal_name}", "--", *command]


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
