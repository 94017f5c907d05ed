"""One module per ``kvtier`` verb (see ``kvtier/cli.py`` for the contract)."""

from kvtier.errors import NotYetAvailable


def not_yet(verb: str, issue: int, what: str) -> NotYetAvailable:
    """The error a registered verb raises until the issue that builds it lands."""
    return NotYetAvailable(f"'{verb}' is registered but not built yet: {what} (issue #{issue})")
