"""Errors a user can cause. The CLI turns these into one clear line and exit code 2."""


class LartpcError(Exception):
    """Base class: bad input, file, option or config, explained in the message."""


class ConfigError(LartpcError, ValueError):
    """A config key, value or combination is invalid."""


class MissingPackage(LartpcError, ImportError):
    """An optional package the chosen option needs is not installed (the message says
    how to install it)."""
