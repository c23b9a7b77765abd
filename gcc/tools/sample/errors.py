"""The tool's one error type."""


class SampleError(ValueError):
    """A user-facing error (bad option, missing clip/file, vocab mismatch); the message says what and where."""
