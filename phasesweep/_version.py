"""The installed distribution's version: a leaf, so the report and the CLI can name it
without importing the package that re-exports the API (which imports them)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("phasesweep")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
