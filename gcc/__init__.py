"""gcc: the gc25d teacher trainer (Wan2.2-TI2V-5B + per-pixel semantic condition) on Composer + Streaming."""

__version__ = "0.1.0"
