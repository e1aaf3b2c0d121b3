"""Refactor guards: fingerprints of behaviour that must not change in a refactor, and the record of
two commits' code as equivalent (docs/reproduction.md, "Results")."""
