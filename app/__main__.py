"""``python -m pipeline`` runs the llmslo CLI (same as the ``llmslo`` console script)."""

from pipeline.cli import console_main

console_main()
