"""The distillation_effect study (README.md in this folder)."""
