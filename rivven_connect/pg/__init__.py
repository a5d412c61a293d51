"""Postgres CDC (docs/connect-postgres.md): pure cores that turn pgoutput bytes into records.

``pgoutput`` decodes one replication message, ``transactions`` assembles Begin..Commit into
a ``Transaction`` (relation cache, replay filter), ``envelope`` turns a transaction into
``Record``s in the CONTRACT.md CDC envelope. None of them does I/O; the replication
connection and the source driver are the next step.
"""
