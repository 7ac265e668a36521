"""``python -m app`` runs the llmslo CLI (same as the ``llmslo`` console script)."""

from app.cli import console_main

console_main()
