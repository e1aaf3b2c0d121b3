"""The accelerator machine: the GPU suite, the data pack it carries and the claims runner there
(docs/performance.md, "Running the GPU suite")."""
