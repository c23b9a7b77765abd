"""The tool's one error type."""

from gcc import exit_codes


class SampleError(ValueError):
    """A user-facing error (bad option, missing clip/file, vocab mismatch); the message says what and where."""

    exit_code = exit_codes.CONFIG
