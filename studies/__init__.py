"""One-off studies: each folder asks one question, and its README.md states the question, the
command and the finding. Nothing imports a study (tests/test_layering.py)."""
