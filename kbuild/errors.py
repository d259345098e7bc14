"""Errors a user can act on, each with the exit code the CLI maps it to.

Exit codes follow ruff and ninja: 0 success, 1 a target failed, 2 usage,
configuration or internal error.
"""


class KbuildError(Exception):
    """Base class: a message for the user; exit code 2 unless overridden."""

    exit_code = 2


class ConfigError(KbuildError):
    """kbuild.toml is missing, unreadable or malformed."""


class TargetError(KbuildError):
    """A declared target cannot be resolved: module, attribute, kind, signature or arch."""


class KeyingError(KbuildError):
    """Something a kernel depends on cannot be encoded deterministically."""


# What a KeyingError says of a source that no longer holds the bytes its import compiled
# (`sources.check_imported`); recognised in the text it travels as.
CHANGED_AFTER_IMPORT = "changed after this process imported it"


class StoreError(KbuildError):
    """The store cannot be used (not writable, not a store, ...)."""


class CompileError(KbuildError):
    """numba or the CUDA toolchain rejected a target; the row is marked failed."""

    exit_code = 1


class LaunchError(KbuildError):
    """A kernel cannot be launched from the store (no matching signature or artifact)."""

    exit_code = 1
