"""The reproduce report: per-method tables, paired differences, verdicts and curves, as markdown.

Reads the result JSONs of one claim and budget (:mod:`fedjax_proj.reproduce.run`), keeps those
whose fingerprint matches the claim's current config (stale ones are counted, not mixed in), and
writes ``report.md``, ``accuracy.png`` (headline metric per round, mean over seeds; for a
continual claim, the mean accuracy over the tasks seen after each task) and, when FedProj logged
its memory loss, ``lmem_vs_accuracy.png`` (paper 001, Figure 4) next to them.
:func:`update_docs` regenerates docs/reproduction.md's results section from every report.

The package: :mod:`.results` (loading, protocols, diverged runs, code equivalence),
:mod:`.verdicts`, :mod:`.tables`, :mod:`.figures`, :mod:`.timing` (recorded times, ETA) and
:mod:`.writer` (report.md, verdicts.json, the docs' section); this module re-exports their names.
"""

from __future__ import annotations

from fedjax_proj.reproduce.report.figures import plot_curves, plot_task_accuracy
from fedjax_proj.reproduce.report.results import (
  CURVE_METRIC,
  EQUIVALENCE_FILE,
  VERDICTS_FILE,
  format_value,
  load_equivalence,
  per_seed,
  seed_ranges,
  arithmetic,
  backend_of,
  code_of,
  computation,
  diverged_lines,
  equivalent_pairs,
  load_results,
  machine_label,
  machines,
  metric_value,
  same_code,
  split_diverged,
  split_protocols,
)
from fedjax_proj.reproduce.report.tables import (
  _glance_mean,
  ablation_table,
  curve_table,
  diagnostics,
  exploratory_table,
  glance_table,
  method_table,
)
from fedjax_proj.reproduce.report.timing import _duration, completion_lines, eta, recorded_seconds
from fedjax_proj.reproduce.report.verdicts import (
  Confirmatory,
  Magnitude,
  _number,
  _p,
  _paired_cells,
  confirmatory_rows,
  declared_seeds,
  magnitude,
  magnitude_cells,
  measured_sd,
  paired_rows,
  verdict_records,
  verdict_table,
  verdict_text,
)
from fedjax_proj.reproduce.report.writer import (
  BEGIN,
  END,
  render,
  update_docs,
  v2_section,
  write_report,
)

__all__ = [
  "BEGIN",
  "CURVE_METRIC",
  "Confirmatory",
  "END",
  "EQUIVALENCE_FILE",
  "Magnitude",
  "VERDICTS_FILE",
  "_duration",
  "format_value",
  "_glance_mean",
  "load_equivalence",
  "_number",
  "_p",
  "_paired_cells",
  "per_seed",
  "seed_ranges",
  "ablation_table",
  "arithmetic",
  "backend_of",
  "code_of",
  "completion_lines",
  "computation",
  "confirmatory_rows",
  "curve_table",
  "declared_seeds",
  "diagnostics",
  "diverged_lines",
  "equivalent_pairs",
  "eta",
  "exploratory_table",
  "glance_table",
  "load_results",
  "machine_label",
  "magnitude",
  "magnitude_cells",
  "machines",
  "measured_sd",
  "method_table",
  "metric_value",
  "paired_rows",
  "plot_curves",
  "plot_task_accuracy",
  "recorded_seconds",
  "render",
  "same_code",
  "split_diverged",
  "split_protocols",
  "update_docs",
  "v2_section",
  "verdict_records",
  "verdict_table",
  "verdict_text",
  "write_report",
]
