"""One module per `bertjax` subcommand (see bertjax/cli.py)."""
