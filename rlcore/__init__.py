"""rlcore: an AReaL-style asynchronous LLM RL runtime with matched sync and threaded baselines."""
