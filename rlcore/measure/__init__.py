"""Benchmarks and the real-size smoke: speed, memory and load, measured on finished
or running jobs. No run job imports this package."""
