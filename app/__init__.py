"""The top floor: the ``llmslo`` command and the wiring of processes.

Everything that starts or wires components lives here and nowhere below: the command
line (:mod:`app.cli`, one module per command group under :mod:`app.commands`), the
pipeline process of ``llmslo run`` (:mod:`app.run`), the demo (:mod:`app.demo`) and the
table of config sections (:mod:`app.sections`). Packages below (``pipeline``,
``collectors``, ``simulator``, ``slo``, and later ``alerts``, ``api``, ``dashboards``)
never import this one.
"""
