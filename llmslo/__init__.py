"""The top floor: the ``llmslo`` command and the wiring of processes.

Everything that starts or wires components lives here and nowhere below: the command
line (:mod:`llmslo.cli`, one module per command group under :mod:`llmslo.commands`), the
pipeline process of ``llmslo run`` (:mod:`llmslo.run`), the demo (:mod:`llmslo.demo`) and the
table of config sections (:mod:`llmslo.sections`). Packages below (``pipeline``,
``collectors``, ``simulator``, ``slo``, ``alerts``, ``api``, ``dashboards``)
never import this one.
"""
