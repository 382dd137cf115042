"""Pure math: objectives, advantages, staleness rules and run metrics."""
