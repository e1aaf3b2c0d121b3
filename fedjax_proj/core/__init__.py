"""Core: pytree utilities, PRNG derivation, shared types and the client engine."""
