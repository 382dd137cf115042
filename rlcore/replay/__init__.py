"""Replay: re-execute a run's recorded schedule, bit for bit or under another objective."""
