"""The ewc_stability study (README.md in this folder)."""
