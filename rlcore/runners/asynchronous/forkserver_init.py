"""Imported by the fork server alone, first: the server dies with the process that started it.

A worker's OS parent is the fork server, so a worker asks to die with the server
(`vehicles._process_entry`) and the server, here, with the main process: killing the main
process, even by SIGKILL, takes the server and then every worker. Linux ties this to the
thread that started the server, the main thread in `rlcore run`.
"""

import os

from rlcore.runners.asynchronous.health import die_with_parent

die_with_parent(os.getppid())
