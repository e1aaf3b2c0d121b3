"""The reproduce report: per-method tables, paired differences, verdicts and curves, as markdown.

Reads the result JSONs of one claim and budget (:mod:`fedjax_proj.reproduce.run`), keeps those
whose fingerprint matches the claim's current config (stale ones are counted, not mixed in), and
writes ``report.md``, ``accuracy.png`` (headline metric per round, mean over seeds; for a
continual claim, the mean accuracy over the tasks seen after each task) and, when FedProj logged
its memory loss, ``lmem_vs_accuracy.png`` (paper 001, Figure 4) next to them.
:func:`.writer.update_docs` regenerates docs/reproduction.md's results section from every report.

The package: :mod:`.results` (loading, protocols, diverged runs, code equivalence),
:mod:`.verdicts`, :mod:`.tables`, :mod:`.figures`, :mod:`.timing` (recorded times, ETA) and
:mod:`.writer` (report.md, verdicts.json, the docs' section). Each name is imported from the
module that defines it (e.g. ``report.writer.write_report``); this package defines none.
"""
