"""``llmslo ingest`` that SIGKILLs itself right after its Nth DuckDB commit, before Kafka hears
of it: the exactly-once tests' deterministic crash, injected as the ingester's
``after_commit`` callback (production code has no crash switch).

Usage: ``python -m tests.pipeline.crashing_ingest N <llmslo arguments: -v ingest -c … --db …>``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence

from llmslo.cli import build_parser
from llmslo.commands.spine import run_ingest

log = logging.getLogger("tests.pipeline.crashing_ingest")


def main(argv: Sequence[str]) -> int:
    crash_at = int(argv[0])

    def crash(commits: int) -> None:
        if commits == crash_at:
            log.warning("crashing after DuckDB commit %d (test)", commits)
            os.kill(os.getpid(), signal.SIGKILL)

    args = build_parser().parse_args(argv[1:])
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_ingest(args, after_commit=crash)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
