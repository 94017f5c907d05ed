"""Errors the command line reports as one line with a non-zero exit, not a traceback."""


class KvtierError(Exception):
    """A problem with the user's input or environment (bad value, missing file, unknown
    format). The message is shown as-is, so it should name the bad value and what would do."""
