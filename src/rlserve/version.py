"""The package version, on its own so that every layer can read it without the front door."""

__version__ = "0.1.0"
