"""Alembic migrations of the storage schema, shipped inside the package.

They run automatically when a database is opened (`storage.open_database`)
and on `mpipe db upgrade`.  To write a new one after changing
`storage/models.py`:

    .venv/bin/alembic -c storage/migrations/alembic.ini revision --autogenerate -m "what changed"

(it compares the models with the database named by MPIPE_DB_URL, by default a
scratch SQLite file), then read and fix the generated file.  Version rows are
protected by triggers (see 0001): a SQLite batch migration that recreates
`schedule_versions` or `workload_versions` must create them again.

Bump HEAD with every new migration (a test checks it): opening a database
that is already at HEAD then costs one query and no Alembic import.
"""

HEAD = "0008"
