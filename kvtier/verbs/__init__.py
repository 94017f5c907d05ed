"""One module per ``kvtier`` verb (see ``kvtier/cli.py`` for the contract)."""
