"""The one error type for bad data: `BadInput`."""


class BadInput(Exception):
    """Input that cannot be used (prepared clips, shards, a manifest); the message names the file or clip, the
    field, and what was expected."""
