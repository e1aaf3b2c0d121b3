"""The setup every run shares, in one place: the one-task run and the continual run are twins.

A one-task run (:func:`fedjax_proj.training.experiment.run_experiment`) and a continual run
(:func:`fedjax_proj.training.continual.run_continual_experiment`) differ in their data and their
driver (the round loop's :func:`~fedjax_proj.training.loop.train`, or the task loop); the rest is
the same steps, taken here: holding the run directory (:func:`held`), initialising the model and
deciding the execution (:func:`init_and_plan`: strategy, sharding and the chunk that bounds every
pass over the clients), the header line (:func:`header`) and the summary's record of both
(:func:`summary_extra`). docs/design.md, "The round loop".
"""

from __future__ import annotations

import jax

from fedjax_proj.core import engine as engine_lib
from fedjax_proj.core.executor import Executor
from fedjax_proj.core.types import Model
from fedjax_proj.models.base import count_params
from fedjax_proj.training import rundir
from fedjax_proj.training.placement import plan_execution


def held(c, output_dir: str, **kwargs):
  """:func:`~fedjax_proj.training.rundir.held` on ``output_dir`` with the config's ``resume``
  and ``overwrite``: a directory holding a run is refused unless one of them is set."""
  return rundir.held(output_dir, resume=c.resume, overwrite=c.overwrite, **kwargs)


def init_and_plan(c, model: Model, sample, batch_fn, log, *, shard: bool = True):
  """(initial variables, the run's executor): ``model`` initialised from ``c.seed`` on the
  normalised ``sample``, and :func:`~fedjax_proj.training.placement.plan_execution` for it (the
  ``auto`` strategy's model kind and the ``auto`` chunk's memory per client come from them)."""
  variables = model.init(jax.random.key(c.seed), sample)
  has_conv = engine_lib.has_convolution(
    lambda v, x: model.apply(v, x, train=False).logits, variables, sample
  )
  executor = plan_execution(
    c, batch_fn, has_conv=has_conv, variables=variables, log=log, shard=shard
  )
  return variables, executor


def header(c, executor: Executor, fields: list[str]) -> str:
  """The run's first line, ``backend=... devices=... strategy=... method=...``, then the run's own
  ``fields`` (``key=value`` words; :func:`params` among them)."""
  processes = f"processes={jax.process_count()} " if jax.process_count() > 1 else ""
  return (
    f"backend={jax.default_backend()} devices={jax.device_count()} {processes}"
    f"strategy={executor.strategy} method={c.method} " + " ".join(fields)
  )


def params(variables) -> str:
  """The header's ``params=N`` word."""
  return f"params={count_params(variables)}"


def summary_extra(c, executor: Executor, **extra) -> dict:
  """The summary fields every run records: the strategy it ran and its whole config."""
  return {"strategy": executor.strategy, "config": c.to_dict(), **extra}
