"""Postgres CDC (docs/connect-postgres.md): pure cores that turn pgoutput bytes into records.

``pgoutput`` decodes one replication message, ``transactions`` assembles Begin..Commit into
a ``Transaction`` (relation cache, replay filter), ``envelope`` turns a transaction into
``Record``s in the CONTRACT.md CDC envelope, ``snapshot`` plans starts and positions of
snapshots. None of them does I/O; ``slot`` (the replication connection) and
``snapshot_reader`` (the exporting slot creation, keyset reads) do.
"""
