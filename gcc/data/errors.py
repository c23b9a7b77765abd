"""The one error type for bad data: `BadInput`."""


class BadInput(Exception):
    """Input that cannot be used (prepared clips, shards, a manifest); the message names the file or clip, the
    field, and what was expected."""


class DamagedData(BadInput):
    """A shard or index that cannot be read back as written: a failed hash check, a decompression or decoding
    error, a missing or unreadable file. The message names the data, the split and the shard file."""
