"""``python -m llmslo`` runs the llmslo CLI (same as the ``llmslo`` console script)."""

from llmslo.cli import console_main

# Guarded: drill workers are spawned interpreters that import the parent's ``__main__``
# module (as ``__mp_main__``); unguarded, each would run the parent's command again.
if __name__ == "__main__":
    console_main()
