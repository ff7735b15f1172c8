"""distrl's version, in a module of its own so that nothing inside the package imports the package root."""

__version__ = "0.1.0"
