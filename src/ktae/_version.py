"""The package's version, readable without importing the package (``ktae --version`` of a
source tree that is not installed)."""

__version__ = "0.1.0"
