"""Environment wrappers that record rollouts."""
