"""exactly's version (one place: the package, the history's run records)."""

__version__ = "0.1.0"
