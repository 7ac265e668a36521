"""One module per command group, each with ``register(subparsers) -> None`` (see :mod:`llmslo.cli`)."""
