"""The continual_subspace study (README.md in this folder)."""
