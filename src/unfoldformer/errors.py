"""Errors caused by input, settings or files rather than by bugs.

Every command catches `UnfoldformerError`, prints `unfoldformer COMMAND: error: MESSAGE` in one
line and exits with status 2; anything else is a bug and keeps its traceback. The subclasses
also derive from the built-in error a caller would expect (`ValueError`, `FileNotFoundError`,
`RuntimeError`), so `except ValueError` keeps working.
"""
from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError", "IntegrityError", "OutputError", "PretrainedError", "UnfoldformerError",
           "UnverifiedFileWarning"]


class UnfoldformerError(Exception):
    """Base of the errors a command reports in one line (exit status 2)."""


class ConfigError(UnfoldformerError, ValueError):
    """An invalid setting, raised before any work starts; the message names the setting and its range."""


class OutputError(UnfoldformerError, OSError):
    """An output location that cannot be written, is in use by another run, or holds files that are not ours."""


class IntegrityError(UnfoldformerError, RuntimeError):
    """A file that differs from what its run wrote (the folder's manifest `complete.json` says so), or a file
    without checksums that nothing vouches for."""


class CheckpointError(UnfoldformerError, RuntimeError):
    """A checkpoint or weights file that is missing, truncated, corrupt or not ours (the message names it)."""


class PretrainedError(UnfoldformerError, ValueError):
    """A pretrained folder or repo that is missing, damaged, or holds another model (the message names it)."""


class UnverifiedFileWarning(UserWarning):
    """A file read without an integrity check, because the caller said to trust it (`trust_unverified`)."""
