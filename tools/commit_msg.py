"""Commit subjects that read as a changelog: at most 72 characters, one line, then a blank line
before the body (figures and reasons go in the body).

    python tools/commit_msg.py FILE          the commit-msg hook (`make hooks` installs it)
    python tools/commit_msg.py [--since REV] every commit on HEAD after REV (default: the
                                             last one before the rule; `make lint`)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

MAX_SUBJECT = 72
# The history before this commit keeps its long subjects; every later one is checked.
FIRST_CHECKED_AFTER = "865db80"


def problems(message: str) -> list[str]:
    """What is wrong with a commit message's subject; empty when nothing is."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    subject = lines[0].rstrip() if lines else ""
    found = []
    if not subject:
        found.append("the subject is empty")
    if len(subject) > MAX_SUBJECT:
        found.append(f"the subject has {len(subject)} characters, more than {MAX_SUBJECT}: "
                     "say what changed in the imperative and move figures and reasons to "
                     "the body")
    if len(lines) > 1 and lines[1].strip():
        found.append("the second line is not blank: the subject is one line, then a blank "
                     "line, then the body")
    return found


def check_range(since: str) -> int:
    """Check every commit after `since` on HEAD; 0 when all pass."""
    known = subprocess.run(["git", "cat-file", "-e", f"{since}^{{commit}}"],
                           capture_output=True).returncode == 0
    if not known:
        print(f"commit_msg: {since} is not in this clone (shallow?): subjects not checked")
        return 0
    out = subprocess.run(["git", "log", "--format=%h%x00%B%x01", f"{since}..HEAD"],
                         capture_output=True, text=True, check=True).stdout
    bad = 0
    for entry in filter(str.strip, out.split("\x01")):
        sha, message = entry.strip("\n").split("\x00", 1)
        for p in problems(message):
            print(f"commit {sha}: {p}")
            bad += 1
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", help="the commit message file (hook mode)")
    parser.add_argument("--since", default=FIRST_CHECKED_AFTER,
                        help="without FILE: check the commits after this revision")
    args = parser.parse_args(argv)
    if not args.file:
        return check_range(args.since)
    found = problems(Path(args.file).read_text())
    for p in found:
        print(f"commit-msg: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
