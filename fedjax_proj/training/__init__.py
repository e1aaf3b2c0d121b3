"""Round loop, evaluation, metrics files and the config-driven experiment runner."""
