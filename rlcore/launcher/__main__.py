"""`python -m rlcore.launcher ARGV`: `rlcore ARGV`, forked from the warm launcher's server.

`python -m rlcore.launcher --status` says where the server lives and whether one runs;
`--stop` asks it to exit once its running jobs have ended.
"""

import os
import sys

from rlcore.launcher.client import launch, ping, stop
from rlcore.launcher.protocol import LOG, LauncherUnavailable, launcher_dir, server_key


def main(argv: list[str]) -> int:
    if argv in (["--status"], ["--stop"]):
        directory = launcher_dir(os.environ)
        info = ping(directory) if directory.is_dir() else None
        if argv == ["--stop"]:
            pid = stop(directory) if info else None
            print(f"stopped the server {pid}" if pid else "no server was running")
            return 0
        state = "no server" if info is None else (
            f"server {info['pid']}, {info['jobs']} job(s) running, key {info['key']} ("
            + ("this code's" if info["key"] == server_key(os.environ) else "stale") + ")")
        print(f"{state}\ndirectory: {directory}\nlog: {directory / LOG}")
        return 0
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return launch(argv)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except LauncherUnavailable as e:  # --status or --stop with an unusable directory
        print(f"rlcore launcher: {e}", file=sys.stderr)
        sys.exit(1)
