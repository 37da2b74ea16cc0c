"""packsim (public API wired in once all modules land)."""

__version__ = "0.1.0"
