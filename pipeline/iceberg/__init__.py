"""The lake as Apache Iceberg tables (``store.lake: iceberg``), on S3-compatible storage or a
local path, through a SQL catalog (SQLite for one host, PostgreSQL for a fleet).

* :mod:`pipeline.iceberg.config`: the ``store.iceberg`` section and the object-store
  credentials (from the environment or a credentials file, never from the config file);
* :mod:`pipeline.iceberg.tables`: llmslo's record schemas as Iceberg-typed Arrow schemas,
  partitioned by hour;
* :mod:`pipeline.iceberg.lake`: :class:`~pipeline.iceberg.lake.IcebergLake`, which appends
  each committed batch with the Kafka offsets it covers in the same Iceberg commit, its
  data files written by :mod:`pipeline.iceberg.files` (pyarrow, dictionaries kept);
* :mod:`pipeline.iceberg.maintenance`: :class:`~pipeline.iceberg.maintenance.LakeMaintainer`,
  the housekeeping pass (retention, compaction, snapshot expiry), and
  :mod:`pipeline.iceberg.cleanup`, which deletes the files no snapshot references any more;
* :mod:`pipeline.iceberg.mirror`: :class:`~pipeline.iceberg.mirror.IcebergMirror`, the
  lake's recent rows in the SLO jobs' own DuckDB file, loaded data file by data file.

``pyiceberg`` is the ``lake`` extra (``pip install 'llmslo[lake]'``): only processes that
write or read the Iceberg lake import it.
"""
