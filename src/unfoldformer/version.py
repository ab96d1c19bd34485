"""The library's version (pyproject.toml says the same), importable from every floor."""

__version__ = "0.3.0"
