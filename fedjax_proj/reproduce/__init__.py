"""Reproduce a paper claim with one command (docs/reproduction.md, "Results")."""
