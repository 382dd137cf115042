"""The warm launcher: `rlcore` commands forked from a process that has imported torch and
transformers already, so a pipeline job skips its seconds of start-up.

  protocol.py  where the server lives, which server may run a client's command (its key:
               the code, the interpreter and its start-up variables), the messages
  client.py    `python -m rlcore.launcher ARGV`: hands the command and its standard streams
               to the server, relays the job's status and signals; runs it cold instead
               whenever the launcher cannot
  server.py    imports once, forks one job per request, kills a job whose client is gone,
               exits when idle or replaced
  job.py       the forked job: the client's streams, directory, environment, signals; then
               `rlcore.cli.main`, ended as the interpreter would end it
  __main__.py  `python -m rlcore.launcher`: the client's command line, and the server's
               `--status` and `--stop`

docs/launcher.md describes it; `RLCORE_LAUNCHER=cold` (pipeline: `launcher: cold`) turns it
off.
"""
