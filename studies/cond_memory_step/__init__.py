"""The cond_memory_step study (README.md in this folder)."""
