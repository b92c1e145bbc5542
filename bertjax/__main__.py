from bertjax.cli import entry

entry()
