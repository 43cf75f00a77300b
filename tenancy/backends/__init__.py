"""Database backends of the tenancy app (see :mod:`tenancy.backends.postgresql`)."""
