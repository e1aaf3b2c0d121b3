"""benchmarks/device/gpu_suite.py end to end at --tiny on CPU, its data packer and the rule writer.

The suite's numbers on CPU mean nothing; these tests check that the one command a GPU session will
run works: every step runs, the JSON has the documented schema, and the correctness step passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks.device import gpu_suite, make_device_data
from benchmarks.perf import strategies
from tests.core.multiprocess import cpu_env

ROOT = Path(__file__).resolve().parents[3]
CLAIMS_ON_DEVICE = ROOT / "benchmarks" / "device" / "claims_on_device.sh"


def _fake_shared(root: Path, per_class: int = 12) -> Path:
  """A small folder in the layout of ../shared/data (random pixels, real JPEG files)."""
  rng = np.random.default_rng(0)
  for split, n in (("train", per_class), ("test", 4)):
    for c in make_device_data.CIFAR10_CLASSES:
      folder = root / "cifar10" / split / c
      folder.mkdir(parents=True)
      for i in range(n):
        img = rng.integers(0, 255, (32, 32, 3), np.uint8)
        Image.fromarray(img).save(folder / f"{i:04d}.jpg", quality=75)
  (root / "cifar100").mkdir()
  np.savez(
    root / "cifar100" / "public_20k.npz",
    image=rng.integers(0, 255, (64, 32, 32, 3), np.uint8),
    label=rng.integers(0, 100, 64),
  )
  (root / "mnist").mkdir()
  for split, n in (("train", 400), ("test", 100)):
    np.savez(
      root / "mnist" / f"{split}.npz",
      image=rng.integers(0, 255, (n, 28, 28, 1), np.uint8),
      label=np.arange(n) % 10,
    )
  return root


def _pack(shared: Path, out: Path, *extra: str) -> int:
  return make_device_data.main(
    [f"--shared={shared}", f"--out_dir={out}", "--public=48", "--mnist_train=300",
     "--mnist_test=80", *extra]
  )  # fmt: skip


def test_device_data_round_trip_is_exact(tmp_path):
  shared = _fake_shared(tmp_path / "shared")
  assert _pack(shared, tmp_path / "dev", "--cifar10_train=1000", "--cifar10_test=1000") == 0
  counts = make_device_data.unpack(tmp_path / "dev" / "device_data.npz", tmp_path / "data")
  assert counts["cifar10/train.npz"] == 120 and counts["cifar10/test.npz"] == 40
  assert counts["cifar100/public_20k.npz"] == 48 and counts["mnist/train.npz"] == 300
  with np.load(tmp_path / "data" / "cifar10" / "train.npz") as z:
    images, labels = z["image"], z["label"]
  # All files taken (n >= total): class order, sorted names; pixels = PIL's decode of the file.
  assert labels.tolist() == [c for c in range(10) for _ in range(12)]
  first = shared / "cifar10" / "train" / "bird" / "0003.jpg"
  np.testing.assert_array_equal(images[2 * 12 + 3], np.asarray(Image.open(first).convert("RGB")))
  with (
    np.load(tmp_path / "data" / "mnist" / "test.npz") as z,
    np.load(shared / "mnist" / "test.npz") as src,
  ):
    assert z["image"].dtype == np.uint8 and z["image"].shape == (80, 28, 28, 1)
    # Raw MNIST rows are kept byte for byte.
    rows = {r.tobytes() for r in src["image"]}
    assert all(r.tobytes() in rows for r in z["image"])


def test_lossless_public_set_round_trips_exactly_and_mnist_can_be_left_out(tmp_path):
  shared = _fake_shared(tmp_path / "shared")
  args = ("--public_format=webp_lossless", "--mnist_train=0", "--public=64")
  assert _pack(shared, tmp_path / "dev", *args) == 0
  counts = make_device_data.unpack(tmp_path / "dev" / "device_data.npz", tmp_path / "data")
  assert "mnist/train.npz" not in counts and not (tmp_path / "data" / "mnist").exists()
  with (
    np.load(tmp_path / "data" / "cifar100" / "public_20k.npz") as z,
    np.load(shared / "cifar100" / "public_20k.npz") as src,
  ):
    np.testing.assert_array_equal(z["image"], src["image"])  # every pixel, not JPEG's
    np.testing.assert_array_equal(z["label"], src["label"])
  with np.load(tmp_path / "dev" / "device_data.npz") as z:
    assert "lossless" in str(z["about"])


def test_claims_on_device_packs_what_it_ran_and_names_what_the_deadline_left(tmp_path):
  shared = _fake_shared(tmp_path / "shared")
  assert _pack(shared, tmp_path / "dev", "--cifar10_train=100", "--cifar10_test=40") == 0
  out = tmp_path / "out"
  env = {
    **cpu_env(),
    "OUT": str(out),
    "WORK": str(tmp_path / "work"),
    "DEVICE_DATA": str(tmp_path / "dev" / "device_data.npz"),
    "JOBS": "1",
    "EXTRA_ARGS": "--seeds=0 --methods=fedavg",
    # This interpreter, not python3 from PATH (which, outside an activated venv, lacks Pillow).
    "PYTHON": sys.executable,
  }
  env.pop("JAX_DEFAULT_MATMUL_PRECISION", None)
  # 61 s, counted from the first claim's start: it starts (60 or 61 s left, whole seconds); its
  # run (a Python process importing JAX, >= 2 s) leaves the second claim < 60 s.
  claim = "fedproj-iris-pilot:smoke"
  proc = subprocess.run(
    ["bash", str(CLAIMS_ON_DEVICE), "61", claim, claim],
    cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
  )  # fmt: skip
  assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert f"deadline reached, {claim} not started" in proc.stdout
  with tarfile.open(out / "claims_results.tgz") as tar:
    names = [n for n in tar.getnames() if n.endswith(".json")]
    assert names == ["./fedproj-iris-pilot/smoke/fedavg-seed0.json"]  # new results only
    result = json.loads(tar.extractfile(names[0]).read())
  assert result["machine"]["matmul_precision"] == "float32"  # pinned by the script
  assert (out / "claims.log").read_text().count("done fedproj-iris-pilot smoke fedavg seed 0") == 1
  bad = subprocess.run(
    ["bash", str(CLAIMS_ON_DEVICE), "60", "fot-pmnist-iid"],
    cwd=ROOT, capture_output=True, text=True, env=env,
  )  # fmt: skip
  assert bad.returncode == 2 and "is not CLAIM:BUDGET" in bad.stderr
  # The pack's public set is JPEG: a FedProj claim is refused at once. A fresh work folder, as on a
  # fresh machine: the check resolves configs, which must find the unpacked data files.
  lossy = subprocess.run(
    ["bash", str(CLAIMS_ON_DEVICE), "60", "fedproj-cifar10-dir0.5:cpu"],
    cwd=ROOT, capture_output=True, text=True, env={**env, "WORK": str(tmp_path / "fresh")},
  )  # fmt: skip
  assert lossy.returncode == 3 and "--public_format=webp_lossless" in lossy.stderr, lossy.stderr
  # No run started: a run takes its lock first (the folder itself may hold committed results).
  claim_dir = tmp_path / "fresh" / "results" / "fedproj-cifar10-dir0.5" / "cpu"
  assert not list(claim_dir.glob("*.lock")) and not list(claim_dir.glob("*.work"))


def test_device_data_subset_is_stratified_and_size_capped(tmp_path, capsys):
  shared = _fake_shared(tmp_path / "shared")
  assert _pack(shared, tmp_path / "dev", "--cifar10_train=50", "--cifar10_test=20") == 0
  with np.load(tmp_path / "dev" / "device_data.npz") as z:
    assert np.bincount(z["cifar10_train_label"]).tolist() == [5] * 10
  with pytest.raises(SystemExit) as e:
    _pack(shared, tmp_path / "dev2", "--max_mib=0.001")
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "--max_mib=0.001" in err and "lower --cifar10_train" in err
  assert not (tmp_path / "dev2" / "device_data.npz").exists()


def test_missing_data_falls_back_to_synthetic_loudly(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("FEDJAX_PROJ_SHARED_DATA", str(tmp_path / "nowhere"))
  with pytest.warns(UserWarning, match="not a folder"):
    data = gpu_suite.prepare_data(tmp_path / "absent.npz", tmp_path / "work")
  assert data["source"] == "synthetic" and "SYNTHETIC" in data["warning"]
  assert "SYNTHETIC" in capsys.readouterr().out


def test_rules_from_rows_merges_equal_winners():
  row = lambda kind, c, s, sps: {"kind": kind, "clients": c, "strategy": s, "samples_per_s": sps}
  rows = [
    row("dense", 4, "sequential", 30.0),
    row("dense", 4, "vmap_scan", 20.0),
    row("dense", 16, "sequential", 30.0),
    row("dense", 16, "vmap_scan", 29.0),
    row("dense", 64, "sequential", 10.0),
    row("dense", 64, "vmap_scan", 40.0),
    row("conv", 4, "sequential", 5.0),
    row("conv", 4, "vmap_scan", 1.0),
  ]
  assert strategies.rules_from_rows(rows) == {
    "conv": [[None, "sequential"]],
    "dense": [[16, "sequential"], [None, "vmap_scan"]],
  }


def test_unknown_step_is_refused(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    gpu_suite.main(["--out_dir", str(tmp_path), "--steps=correctness,bogus"])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "--steps=correctness,bogus: unknown bogus; choose from correctness," in err


def test_tiny_suite_runs_end_to_end(tmp_path):
  shared = _fake_shared(tmp_path / "shared", per_class=10)
  assert _pack(shared, tmp_path / "dev", "--cifar10_train=100", "--cifar10_test=40") == 0
  out = tmp_path / "out"
  # FAST_COMPILE (tests/core/multiprocess.py): the steps are compile-bound at these sizes (a tiny
  # BERT round compiles in ~13 s CPU, ~7 s at level 0) and what is checked is that every step's
  # code path runs and agrees with itself (strategies within the correctness tolerance).
  env = cpu_env()
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.device.gpu_suite",
      "--tiny",
      f"--out_dir={out}",
      f"--work_dir={tmp_path / 'work'}",
      f"--data={tmp_path / 'dev' / 'device_data.npz'}",
    ],
    capture_output=True,
    text=True,
    timeout=900,
    env=env,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((out / "suite.json").read_text())
  assert report["schema_version"] == gpu_suite.SCHEMA_VERSION and report["tiny"] is True
  assert report["data"]["source"] == "real"
  assert report["data"]["counts"]["cifar10/train.npz"] == 100
  assert set(report["device"]) >= {"backend", "device_kind", "jax", "load_average"}
  assert list(report["steps"]) == list(gpu_suite.STEPS)
  for name, step in report["steps"].items():
    assert step["status"] == "ok", (name, step)
    assert set(step) >= {"status", "seconds", "budget_s", "result"}
  corr = report["steps"]["correctness"]["result"]
  assert corr["passed"] is True and corr["max_rel_diff"] <= corr["tolerance"]
  assert all(r["scale"] > 0 for r in corr["rows"])
  programs = {r["program"] for r in corr["rows"]}
  assert "fedavg/mlp" in programs and any(p.startswith("fedproj/") for p in programs)
  # FedProj's round-2 metrics come one row each, so a failing row names its metric.
  for k in ("distill_loss", "lmem_global", "projected_fraction", "mean_cos"):
    assert any(p.endswith(f"round-2 {k}") for p in programs), (k, programs)
  thr = report["steps"]["throughput"]["result"]["rows"]
  jax_rows = [r for r in thr if r["framework"] == "jax"]
  assert {r["strategy"] for r in jax_rows} == set(strategies.STRATEGIES)
  assert any(r["chunk"] for r in jax_rows)  # the chunked vmap_scan path ran
  assert all(r["samples_per_s"] > 0 and r["compile_s"] >= 0 for r in jax_rows)
  # The distance to the limit: each row's GFLOP/s is the counted FLOPs of its samples over its
  # round time, a share of the GEMM peak measured on the device in the same run.
  result = report["steps"]["throughput"]["result"]
  peak, per_example = result["gemm_peak"]["peak_gflops"], result["flops_per_example"]["mlp"]
  assert peak > 0 and per_example > 0
  assert result["gemm_peak"]["device"] == report["device"]["device_kind"]
  for r in jax_rows:
    assert r["gflops"] > 0 and r["share_of_peak"] == pytest.approx(r["gflops"] / peak)
  over = report["steps"]["fedproj_overhead"]["result"]
  assert set(over["round_seconds"]) == {"fedavg", "feddf", "fedproj"}
  acc = report["steps"]["accuracy"]["result"]
  for method in ("fedavg", "fedproj"):
    curve = acc["curves"][method]
    assert curve["exit_code"] == 0 and curve["rounds_done"] == 1, curve["log_tail"]
    assert len(curve["test_accuracy"]) == 1
  with tarfile.open(out / acc["state_file"]) as tar:
    names = tar.getnames()
  assert any(n.startswith("accuracy/fedproj/checkpoints") for n in names)
  gpse_cost = report["steps"]["gpse_cost"]["result"]
  assert gpse_cost["ratio_populated"] > 0
  # The jitted server step's compile is reported apart, beside the earlier host path's time.
  assert gpse_cost["gpse_server_first_seconds"] > gpse_cost["gpse_server_seconds"] > 0
  assert gpse_cost["host_server_baseline_seconds"] > 0
  nlp = report["steps"]["nlp_round"]["result"]["rows"]
  assert [r["client_chunk"] for r in nlp] == ["none", "1"] and all(r["train_loss"] > 0 for r in nlp)
  table = (out / "suite.md").read_text()
  assert "TINY CPU SMOKE RUN" in table and "| correctness | ok |" in table


def test_correctness_mark_passes_another_order_and_fails_a_wrong_learning_rate():
  """Step a's relative criterion: the sequential loop (another computation order) passes it, a
  round with one client's learning rate 10% off, or one local step missing, does not."""
  import jax
  import optax

  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.algorithms.fedavg import fedavg
  from fedjax_proj.core import tree as tree_lib
  from fedjax_proj.core.types import RoundData
  from fedjax_proj.data.pipeline import make_batch_fn
  from fedjax_proj.models import get_model

  clients, steps, batch = 4, 5, 8
  n = clients * steps * batch
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, 8, 8, 3)).astype(np.float32)
  y = rng.integers(0, 10, n).astype(np.int32)
  model = get_model("mlp", 10)
  variables = model.init(jax.random.key(0), x[:1])
  idx = np.arange(n, dtype=np.int32).reshape(clients, steps, batch)
  mask = np.ones_like(idx, bool)

  def final(lr, strategy="vmap_scan", mask=mask):
    alg = fedavg(model, optax.sgd(lr, momentum=0.9))
    rd = RoundData(x, y, np.arange(clients, dtype=np.int32), idx, mask,
                   mask.sum((1, 2)).astype(np.float32), {})  # fmt: skip
    state, _ = make_round(alg, strategy, make_batch_fn(lambda v: v))(
      alg.init(variables, jax.random.key(0)), rd, jax.random.key(1)
    )
    return np.asarray(tree_lib.tree_ravel(state.variables))

  ref = final(0.01)
  short = mask.copy()
  short[:, -1] = False  # every client skips its last step
  flats = {
    "vmap_scan": ref,
    "sequential": final(0.01, "sequential"),
    "lr +10%": final(0.011),
    "last step missing": final(0.01, mask=short),
  }
  scale = gpu_suite.scale_of_update(ref, tree_lib.tree_ravel(variables))
  rel = {r["strategy"]: r["rel_diff"] for r in gpu_suite.compare_rows("fedavg/mlp", flats, scale)}
  assert rel["vmap_scan"] == 0.0
  assert rel["sequential"] <= gpu_suite.TOLERANCE
  assert rel["lr +10%"] > gpu_suite.TOLERANCE and rel["last step missing"] > gpu_suite.TOLERANCE
  # Nothing to measure against (a zero update): equal values pass, a difference fails.
  still = gpu_suite.compare_rows("x", {"vmap_scan": np.zeros(3), "sequential": np.zeros(3)}, 0.0)
  moved = gpu_suite.compare_rows("x", {"vmap_scan": np.zeros(3), "sequential": np.ones(3)}, 0.0)
  assert still[1]["rel_diff"] == 0.0 and moved[1]["rel_diff"] == float("inf")


def test_projected_fraction_is_judged_in_flipped_steps():
  """FedProj's projected fraction (of 4 clients x 5 steps here) may differ by one step's
  decision in another summation order; two flips, or the projection gone, fail."""
  share = 1 / 20
  values = {
    "vmap_scan": np.array([0.30]),
    "one flip": np.array([0.30 + share]),
    "two flips": np.array([0.30 - 2 * share]),
    "never projects": np.array([0.0]),
  }
  rows = {r["strategy"]: r for r in gpu_suite.compare_steps("p", values, 20, 0.30)}
  assert [rows[k]["flipped_steps"] for k in values] == [0, 1, 2, 6]
  assert [rows[k]["passed"] for k in values] == [True, True, False, False]
  # The relative mark alone would fail the single flip (1/20 of 0.30 is 0.17 of it).
  assert rows["one flip"]["rel_diff"] > gpu_suite.TOLERANCE


@pytest.mark.parametrize("name", ["cnn", "resnet8"])
def test_torch_models_match_ours_in_parameter_count(name):
  """The suite's PyTorch loop trains the same architectures (runs only where torch is installed)."""
  torch = pytest.importorskip("torch")
  import jax
  import jax.numpy as jnp
  import torch_reference

  from fedjax_proj.models import get_model

  variables = get_model(name, 10).init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  ours = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(variables["params"]))
  theirs = sum(p.numel() for p in torch_reference.torch_cifar_model(name).parameters())
  assert ours == theirs
  out = torch_reference.torch_cifar_model(name)(torch.zeros(2, 3, 32, 32))
  assert tuple(out.shape) == (2, 10)


def test_model_flops_per_example_is_the_traced_steps_count():
  # An MLP's training step on a batch: forward 2·(in·h + h·out) per example and backward twice
  # that (input and weight gradients; the first layer's input gradient is not needed).
  import numpy as np

  x = np.zeros((8, 32, 32, 3), np.uint8)
  y = np.arange(8) % 10
  # The MLP is 3072 -> 200 -> 200 -> 10.
  layers = 3072 * 200 + 200 * 200 + 200 * 10
  expected = 2 * layers + 2 * layers + 2 * (200 * 200 + 200 * 10)
  assert gpu_suite.model_flops_per_example("mlp", x, y, 8) == expected
  assert gpu_suite.achieved(2e9, 2.0, 4.0) == {"gflops": 1.0, "share_of_peak": 0.25}
