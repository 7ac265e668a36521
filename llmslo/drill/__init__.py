"""Chaos drills: inject each failure mode of the matrix into a simulated fleet and score the pipeline.

:mod:`llmslo.drill.matrix` plans the fleets and runs the drill; :mod:`llmslo.drill.modes` is
the matrix as data; :mod:`llmslo.drill.fleet` runs one fleet (its pipeline in
:mod:`llmslo.drill.pipeline`, its edge in :mod:`llmslo.drill.edges`, front-end fleets in
:mod:`llmslo.drill.fronts`), :mod:`llmslo.drill.jobs` runs fleets in worker processes;
:mod:`llmslo.drill.rows` reads back what was stored, :mod:`llmslo.drill.score` scores it and
:mod:`llmslo.drill.report` writes the report. A new failure mode is a row of ``MODES``.
"""
