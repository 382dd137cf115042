"""`python -m rlcore`: the `rlcore` program (cli.entry, which skips the interpreter's
teardown at exit, as the installed script does)."""

from rlcore.cli import entry

entry()
