"""Parity: our methods against their reference implementations on identical inputs
(docs/parity.md); ``common`` is the suite's shared harness."""
