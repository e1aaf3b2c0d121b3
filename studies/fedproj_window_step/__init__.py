"""The fedproj_window_step study (README.md in this folder)."""
