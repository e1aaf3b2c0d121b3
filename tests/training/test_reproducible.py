"""Reproducibility: the same config and seed give the same metrics file byte for byte on CPU.

``round_seconds`` is the only wall-clock field of ``metrics.jsonl``; it is dropped before comparing
(:func:`fedjax_proj.training.checkpoint.comparable_metrics`). FedProj is used because it draws the
most randomness per round (client sampling, batch order, the public memory sample).
"""

from __future__ import annotations

import json

import numpy as np

from fedjax_proj.data.sources import load_dataset
from fedjax_proj.training import experiment
from fedjax_proj.training.checkpoint import comparable_metrics, load_variables
from fedjax_proj.training.config import base_config


def _run(tmp_path, name, public, **overrides):
  c = base_config()
  c.update(
    method="fedproj",
    dataset="digits",
    model="mlp",
    num_clients=6,
    clients_per_round=3,
    rounds=3,
    local_epochs=1,
    eval_every=1,
    progress=False,
    public_data=str(public),
    memory_size=40,
    output_dir=str(tmp_path / name),
    checkpoint_every=0,
  )
  c.update(overrides)
  experiment.run_experiment(c, log=lambda *a: None)
  return tmp_path / name


def test_same_seed_same_metrics_bytes_and_parameters(tmp_path):
  digits = load_dataset("digits", "test")
  public = tmp_path / "public.npz"
  np.savez(public, image=digits.images[:60], label=digits.labels[:60])
  a = _run(tmp_path, "a", public, tensorboard=True)
  b = _run(tmp_path, "b", public)
  records = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in records] == [1, 2, 3]
  assert all(r["train_loss"] is not None and r["test_accuracy"] is not None for r in records)
  assert comparable_metrics(a) == comparable_metrics(b)
  assert (a / "metrics.jsonl").read_text() != comparable_metrics(a)  # timings were really dropped
  va, vb = (load_variables(d / "final_variables.npz") for d in (a, b))
  assert va.keys() == vb.keys() and all(np.array_equal(va[k], vb[k]) for k in va)
  # --tensorboard wrote event files next to the metrics, without changing them.
  events = list((a / "tensorboard").glob("events.out.tfevents.*"))
  assert events and events[0].stat().st_size > 100
