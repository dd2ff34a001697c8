"""Errors the storage layer raises for things a user (or a lost worker) caused.

All subclass `MpipeError`, so the CLI prints one line and exits 2.  Every
operation that raises one has written nothing: it ran in a transaction that
was rolled back.
"""
from __future__ import annotations

from mpipe_core.errors import MpipeError


class StorageError(MpipeError):
    """Base of the storage layer's user-facing errors."""


class DuplicateNameError(StorageError):
    """A schedule or workload name that the library already has."""


class NotFoundError(StorageError):
    """An unknown schedule, workload, version or run."""


class InvalidNameError(StorageError):
    """A schedule name, tag or reference that breaks the naming rules."""


class InvalidValueError(StorageError):
    """A number or setting out of range (steps, ranks, attempts) or a malformed record."""


class ConflictError(StorageError):
    """An operation that the current state forbids (archived schedule, finished run)."""


class ImportFileError(StorageError):
    """A library file that is not valid JSON or not in the export format."""


class DatabaseLockedError(StorageError):
    """The database stayed locked by another process through every retry."""


class SchemaError(StorageError):
    """A database whose schema this version of mpipe cannot use (e.g. a newer one)."""


class LeaseLostError(StorageError):
    """A worker touched a run it no longer holds (its lease expired, or it finished)."""


class PermissionDeniedError(StorageError):
    """An action the actor's role does not allow (recorded in the audit trail as refused)."""
