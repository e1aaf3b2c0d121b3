"""The card a result records of the machine it computed on (docs/reproduction.md, "The gpu
budget": each card named in the results' ``machine``)."""

from __future__ import annotations

import subprocess

from fedjax_proj.reproduce import provenance
from fedjax_proj.reproduce.report import results as report_results


def test_a_result_records_its_card(tmp_path, monkeypatch):
  calls = []

  def smi(args, **kwargs):
    calls.append(args)
    return subprocess.CompletedProcess(args, 0, "NVIDIA H200, GPU-8bdce5ac-0000\n", "")

  monkeypatch.setattr(subprocess, "run", smi)
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
  # JAX's device 0 is the first visible GPU: nvidia-smi is asked about that one.
  assert provenance.card("gpu", "NVIDIA H200") == "NVIDIA H200, GPU-8bdce5ac-0000"
  assert calls[-1][-2:] == ["-i", "3"]

  def missing(args, **kwargs):
    raise FileNotFoundError(args[0])

  monkeypatch.setattr(subprocess, "run", missing)
  assert provenance.card("gpu", "NVIDIA H200") == "NVIDIA H200"  # no nvidia-smi: the kind
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nprocessor\t: 1\n")
  assert provenance.cpu_model(cpuinfo) == "AMD EPYC 7B13"
  assert provenance.cpu_model(tmp_path / "absent") is None
  monkeypatch.setattr(provenance, "cpu_model", lambda: None)
  assert provenance.card("cpu", "cpu") is None  # no model name: none, not JAX's bare "cpu"
  # Every new result carries it (CI computes on CPUs), and the report's machine line names it.
  monkeypatch.setattr(provenance, "cpu_model", lambda: "AMD EPYC 7B13")
  assert provenance.machine_info()["card"] == "AMD EPYC 7B13"
  gpu = {"backend": "gpu", "device_kind": "NVIDIA H200", "matmul_precision": "float32"}
  labelled = report_results.machine_label({"machine": {**gpu, "card": "NVIDIA H200, GPU-8bdce5ac"}})
  assert labelled == "NVIDIA H200, GPU-8bdce5ac (gpu, matmul precision float32)"
  assert (
    report_results.machine_label({"machine": gpu}) == "NVIDIA H200 (gpu, matmul precision float32)"
  )
  cpu = {"backend": "cpu", "device_kind": "cpu", "cores": 2, "cpu_count": 2}
  assert report_results.machine_label({"machine": {**cpu, "card": "AMD EPYC"}}) == (
    "CPU (AMD EPYC), 2 of 2 cores"
  )
