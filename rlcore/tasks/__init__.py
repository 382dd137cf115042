"""Task suites, prompts, the reward harness and its sandbox, and the shipped task data."""
