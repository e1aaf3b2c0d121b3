"""Parity with the FedProj authors' PyTorch code: both codes on identical inputs, side by side.

    pip install -e .[parity]      # torch (CPU build); torchvision is not needed
    git clone https://github.com/Abhijit4-debug/FedProj_Neurips /path/to/FedProj_Neurips
    python -m benchmarks.parity.fedproj --authors_repo=/path/to/FedProj_Neurips

The reference code is never copied into this repository; ``--authors_repo`` points at a checkout.
docs/fedproj.md ("Parity with the authors' code") describes the protocol and the verdict rule.

Our side is ``experiments/cifar10.py --preset=paper_code`` at a reduced budget, run through
:func:`fedjax_proj.training.experiment.run_experiment` (the CLI's own path). The inputs of each seed
are exported from our runner (:func:`export_inputs`, the same library calls the runner makes):
the CIFAR-10 training and test subsets, the Dirichlet partition, the clients sampled in each round
and their batches (index order and epochs), the public CIFAR-100 subset, the initial weights of our
``cnn`` and our normalisers. The adapter (:class:`AuthorsCode`) feeds them to the authors' client
classes (``src/client/client_fedavg.py``, ``src/client/client_fedproj.py``) and their server
helpers (``AvgWeights``, ``eval_test`` in ``src/utils/utils.py``, ``DatasetKD``/``DatasetKDSplit``
in ``src/data/utils_data.py``), loaded from the checkout by name; the server round itself is inline
in ``main_fedproj``/``main_fedavg`` (with dataset download, model zoo and logging), so the adapter
replays its lines (main_fedproj.py 146-335, main_fedavg.py 166-213) with our inputs: client sample,
client training, example-weighted FedAvg, teacher logits on the whole public set, one epoch of
distillation (Adam, batch 128, T² · KL + gamma · reg) and the test accuracy after it.

Only the torch-free files are loaded, so torchvision (which the code imports for datasets and
transforms this adapter replaces) is never imported. Our ``cnn`` is written in torch
(:func:`torch_cnn`) and loaded with our initial weights; its logits match Flax's (checked at
start, ``logits_max_abs_diff`` in the results).

The projection window of the code (rounds 10-89 of 100) is scaled to the run's rounds:
``(round(10 R / 100), round(90 R / 100))`` for both codes (``--proj_rounds`` overrides it).
``--defects=code`` runs both codes with the code's two defects (the integer cast of the memory's
images and logits, client_fedproj.py lines 85-86; the divergence anchor aliasing the live
parameters, main_fedproj.py line 278); ``--defects=fixed`` turns both off in both codes (ours:
``int_cast_memory=False``, ``divergence_anchor=fedavg``; the authors': lines 85-86 without the cast,
and the anchor a detached copy of the FedAvg result).

Writes ``results/parity/parity_<defects>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# The suite's shared harness (docs/parity.md); the torch twin of our CNN.
from benchmarks.parity.common import (
  REFERENCES,
  checkout_commit,
  load_definitions,
)
from benchmarks.parity.common import our_commit as _commit
from benchmarks.perf.torch_reference import torch_cnn, torch_state_from_flax
from benchmarks.results_io import REPO_ROOT, RESULTS_DIR, write_results

ROOT = REPO_ROOT

# The code's projection window (main_fedproj.py lines 209-212) over its 100 rounds.
CODE_WINDOW, CODE_ROUNDS = (10, 90), 100
DEFECTS = ("code", "fixed")


# ---------------------------------------------------------------------------------------------
# Our side: config and the inputs our runner uses


def our_config(method: str, seed: int, args, output_dir: str = ""):
  """The ``paper_code`` preset of experiments/cifar10.py at the run's reduced budget."""
  from fedjax_proj.configs import cifar10 as entry

  c = entry.get_config("paper_code")
  c.update(
    method=method,
    dataset="cifar10",
    data_dir=args.data_dir,
    model="cnn",
    num_clients=args.num_clients,
    clients_per_round=args.clients_per_round,
    rounds=args.rounds,
    local_epochs=args.local_epochs,
    partition=args.partition,
    seed=seed,
    train_subset=args.train_subset,
    test_subset=args.test_subset,
    eval_every=1,
    progress=False,
    public_data=args.public_data if method == "fedproj" else "",
    public_size=args.public_size,
    memory_size=args.public_size,
    output_dir=output_dir,
    checkpoint_every=0,
  )
  c = entry.prepare(c)
  if method == "fedproj":
    c.method_kwargs.proj_rounds = tuple(proj_window(args))
    c.method_kwargs.int_cast_memory = args.defects == "code"
    c.method_kwargs.divergence_anchor = "live" if args.defects == "code" else "fedavg"
  return c


def proj_window(args) -> tuple[int, int]:
  """The code's window (10, 90) of 100 rounds scaled to ``args.rounds`` (or ``--proj_rounds``)."""
  if args.proj_rounds:
    start, stop = (int(v) for v in args.proj_rounds.split(":"))
    return start, stop
  scale = args.rounds / CODE_ROUNDS
  return round(CODE_WINDOW[0] * scale), round(CODE_WINDOW[1] * scale)


def export_inputs(c) -> dict:
  """Everything our runner feeds a run of config ``c``, made by the runner's own calls.

  Mirrors :func:`fedjax_proj.training.experiment._run` up to the round loop and
  :func:`fedjax_proj.training.loop.train`'s per-round client sample and batch layout
  (tests/benchmarks/parity/test_parity_inputs.py checks these against a real run).
  """
  import jax

  from fedjax_proj.data import pipeline
  from fedjax_proj.data.federated import FederatedData
  from fedjax_proj.data.partition import partition
  from fedjax_proj.data.sources import load_dataset
  from fedjax_proj.models import get_model
  from fedjax_proj.training.inputs import public_inputs, public_normalizer, subset

  data_dir = c.data_dir or None
  train_ds = load_dataset(c.dataset, "train", data_dir)
  test_ds = load_dataset(c.dataset, "test", data_dir)
  train_x, train_y = subset(train_ds, c.train_subset, c.seed)
  test_x, test_y = subset(test_ds, c.test_subset, c.seed + 1)
  parts = partition(train_y, c.partition, c.num_clients, c.seed)
  fed = FederatedData(parts, c.batch_size, c.local_epochs)
  round_inputs, _ = public_inputs(c, train_x, train_ds.num_classes, train_ds.name)
  model = get_model(c.model, train_ds.num_classes)
  sample = pipeline.normalizer(0.0, 1.0)(np.asarray(train_x[:2], np.float32))
  variables = model.init(jax.random.key(c.seed), sample)
  normalize = pipeline.normalizer_for(c.dataset, train_x, c.get("normalization", "dataset"))
  public = round_inputs.get("public_images")
  public_normalize = public_normalizer(c, public) or normalize
  rounds = []
  for r in range(c.rounds):
    sampled = fed.sample_clients(r, c.clients_per_round, c.seed)
    idx, mask, _ = fed.round_layout(sampled, r, c.seed)
    rounds.append({"sampled": sampled, "idx": idx, "mask": mask})
  return {
    "train": (np.asarray(train_x), np.asarray(train_y)),
    "test": (np.asarray(test_x), np.asarray(test_y)),
    "parts": parts,
    "steps_per_epoch": [math.ceil(len(p) / c.batch_size) for p in parts],
    "rounds": rounds,
    "public": None if public is None else np.asarray(public),
    "variables": jax.tree.map(np.asarray, variables),
    "normalize": normalize,
    "public_normalize": public_normalize,
    "model": model,
  }


class _CompileSeconds:
  """Seconds JAX spends tracing, lowering and compiling while active: the duration events its
  dispatch records for each program it builds (a program loaded from the persistent cache counts
  its retrieval, not a compile). Compiling runs on the calling thread, so on one pinned core its
  wall seconds are CPU seconds of the process too."""

  EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
  )

  def __init__(self):
    self.seconds = 0.0

  def __call__(self, event: str, duration_secs: float, **kwargs) -> None:
    if event in self.EVENTS:
      self.seconds += duration_secs

  def __enter__(self):
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(self)
    return self

  def __exit__(self, *exc):
    import jax.monitoring

    jax.monitoring.unregister_event_duration_listener(self)


def run_ours(c) -> dict:
  """Runs config ``c`` through the CLI's path; per-round accuracy and projection statistics,
  and the seconds spent compiling (:class:`_CompileSeconds`)."""
  from fedjax_proj.training.experiment import run_experiment

  with _CompileSeconds() as compiling:
    t0, cpu0 = time.perf_counter(), time.process_time()
    run_experiment(c, log=lambda *a: None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
  records = [
    json.loads(x) for x in (Path(c.output_dir) / "metrics.jsonl").read_text().split("\n") if x
  ]
  # CPU seconds of the process, as benchmarks/perf/cpu_step.py measures speed (one pinned core):
  # wall time on a shared machine measures the load as much as the code.
  out = {
    "accuracy": [100.0 * r["test_accuracy"] for r in records],
    "wall_seconds": wall,
    "cpu_seconds": cpu,
    "compile_seconds": compiling.seconds,
  }
  if c.method == "fedproj":
    out["projected_fraction"] = [r.get("projected_fraction") for r in records]
    out["mean_cos"] = [r.get("mean_cos") for r in records]
  return out


# ---------------------------------------------------------------------------------------------
# The authors' side


# client_fedproj.py lines 85-86: the integer cast (a defect); --defects=fixed drops it.
CAST_LINES = (
  "teacher_x = teacher_x.type(torch.LongTensor).float().to(self.device)",
  "teacher_logits = teacher_logits.type(torch.LongTensor).float().to(self.device)",
)
FIXED_LINES = (
  "teacher_x = teacher_x.float().to(self.device)",
  "teacher_logits = teacher_logits.float().to(self.device)",
)


class _DotRecorder:
  """Stands in for ``torch`` in client_fedproj.py to record its projection test.

  Each projected step calls ``torch.dot(grad_new, grad_glob)`` then ``torch.dot(grad_glob,
  grad_glob)`` (lines 117-118); the recorder keeps (dot, ‖g_mem‖², ‖g_new‖²) per step.
  """

  def __init__(self, torch):
    self._torch = torch
    self.steps: list[tuple[float, float, float]] = []
    self._pending = None

  def __getattr__(self, name):
    return getattr(self._torch, name)

  def dot(self, a, b):
    out = self._torch.dot(a, b)
    if a is b and self._pending is not None:
      self.steps.append((self._pending[0], float(out), self._pending[1]))
      self._pending = None
    elif a is not b:
      self._pending = (float(out), float(self._torch.dot(a, a)))
    return out


class AuthorsCode:
  """The authors' client classes and server helpers, loaded from ``repo``."""

  def __init__(self, repo: Path, defects: str):
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import Dataset

    self.torch = torch
    base = {"np": np, "torch": torch, "copy": copy, "nn": nn, "F": F, "Dataset": Dataset}
    src = repo / "src"
    self.helpers = load_definitions(
      src / "utils" / "utils.py", ("AvgWeights", "eval_test"), dict(base)
    )
    load_definitions(src / "data" / "utils_data.py", ("DatasetKD", "DatasetKDSplit"), self.helpers)
    self.fedavg = load_definitions(
      src / "client" / "client_fedavg.py", ("Client_FedAvg",), dict(base)
    )
    text = (src / "client" / "client_fedproj.py").read_text()
    lines = text.splitlines()
    for n, want in zip((85, 86), CAST_LINES):
      if lines[n - 1].strip() != want:
        raise ValueError(
          f"client_fedproj.py line {n} is not {want!r}: another version of the code?"
        )
    if defects == "fixed":
      for n, (old, new) in zip((85, 86), zip(CAST_LINES, FIXED_LINES)):
        lines[n - 1] = lines[n - 1].replace(old, new)
    namespace = dict(base)
    exec(compile("\n".join(lines), str(src / "client" / "client_fedproj.py"), "exec"), namespace)
    self.recorder = _DotRecorder(torch)
    namespace["torch"] = self.recorder  # the class's methods read the global at call time
    self.fedproj = namespace
    self.defects = defects

  @contextlib.contextmanager
  def cpu_cuda(self):
    """AvgWeights calls ``.cuda()`` on every tensor; on a CPU-only run it is the identity."""
    tensor = self.torch.Tensor
    saved = tensor.cuda
    tensor.cuda = lambda self, *a, **k: self
    try:
      yield
    finally:
      tensor.cuda = saved


class _Epochs:
  """A client's ``ldr_train``: our batches of this round, one local epoch per ``iter()``."""

  def __init__(self, x, y, idx, mask, steps_per_epoch):
    self.x, self.y, self.idx, self.mask, self.spe = x, y, idx, mask, steps_per_epoch
    self.epoch = 0
    self.dataset = range(int(mask[:steps_per_epoch].sum()))  # len() = the client's examples

  def __iter__(self):
    torch = sys.modules["torch"]
    start = self.epoch * self.spe
    self.epoch += 1
    for s in range(start, start + self.spe):
      rows = self.idx[s][self.mask[s]]
      yield torch.from_numpy(self.x[rows]), torch.from_numpy(self.y[rows])

  def __len__(self):
    return self.spe


def run_authors(code: AuthorsCode, method: str, inputs: dict, c, window) -> dict:
  """One run of the authors' FedAvg or FedProj on ``inputs`` (main_*.py's round, see module doc)."""
  import torch
  from torch.utils.data import DataLoader, TensorDataset

  t0, cpu0 = time.perf_counter(), time.process_time()
  torch.manual_seed(c.seed)
  np.random.seed(c.seed)
  nchw = lambda a: np.ascontiguousarray(np.asarray(a).transpose(0, 3, 1, 2), np.float32)
  train_x = nchw(inputs["normalize"](inputs["train"][0]))
  train_y = inputs["train"][1].astype(np.int64)
  test_x = torch.from_numpy(nchw(inputs["normalize"](inputs["test"][0])))
  test_dl = DataLoader(
    TensorDataset(test_x, torch.from_numpy(inputs["test"][1].astype(np.int64))), batch_size=128
  )
  net_glob = torch_cnn()
  w_glob = torch_state_from_flax(inputs["variables"])
  net_glob.load_state_dict(w_glob)
  args = argparse.Namespace(device="cpu")
  h = code.helpers
  hp = dict(c.method_defaults.get("fedproj", {}))
  lr, local_bs, local_ep = c.lr, c.batch_size, c.local_epochs
  if method == "fedproj":
    public_x = torch.from_numpy(nchw(inputs["public_normalize"](inputs["public"])))
    pub = TensorDataset(public_x, torch.zeros(len(public_x)))
    public_ds = h["DatasetKD"](pub, np.random.randn(len(pub), 10))  # main_fedproj.py line 37-38
  acc_curve, proj_frac, proj_cos = [], [], []
  for it, rnd in enumerate(inputs["rounds"]):
    idxs_users = [int(k) for k in rnd["sampled"]]  # line 148: our sample
    clients = []
    for j, k in enumerate(idxs_users):
      ldr = _Epochs(train_x, train_y, rnd["idx"][j], rnd["mask"][j], inputs["steps_per_epoch"][k])
      model = copy.deepcopy(net_glob)
      if method == "fedproj":
        client = code.fedproj["Client_FedProj"](
          k, model, local_bs, local_ep, lr, 0.0, hp["temperature"], "cpu", ldr, None
        )
      else:
        client = code.fedavg["Client_FedAvg"](
          k, model, local_bs, local_ep, lr, 0.0, "cpu", ldr, None
        )
      clients.append(client)
    if method == "fedproj":
      # Lines 186-188: the memory (here all of the public subset, memory_bs = its size).
      batch_inds = np.random.choice(len(public_ds), len(public_ds), replace=False)
      batch_public_ds = h["DatasetKDSplit"](public_ds, batch_inds)
      is_proj = window[0] <= it < window[1]  # lines 209-212, scaled
    fractions, coss = [], []
    for client in clients:
      client.set_state_dict(copy.deepcopy(w_glob))
      if method == "fedproj":
        code.recorder.steps.clear()
        client.train(batch_public_ds, is_proj=is_proj, is_print=False)
        if is_proj and code.recorder.steps:
          st = np.asarray(code.recorder.steps)
          fired = (st[:, 0] < 0) & (st[:, 1] > 1e-6)
          fractions.append(float(fired.mean()))
          coss.append(float(np.mean(st[:, 0] / np.sqrt(np.maximum(st[:, 1] * st[:, 2], 1e-24)))))
      else:
        client.train(is_print=False)
    proj_frac.append(float(np.mean(fractions)) if fractions else None)
    proj_cos.append(float(np.mean(coss)) if coss else None)
    # Lines 249-258: example-weighted FedAvg.
    sizes = [len(inputs["parts"][k]) for k in idxs_users]
    freqs = [n / sum(sizes) for n in sizes]
    with code.cpu_cuda():
      w_glob = copy.deepcopy(
        h["AvgWeights"]([copy.deepcopy(cl.get_state_dict()) for cl in clients], weight_avg=freqs)
      )
    net_glob.load_state_dict(w_glob)
    if method == "fedproj":
      # Lines 263-269: teacher logits on the whole public set.
      logits = np.mean([cl.inference(public_ds) for cl in clients], axis=0)
      public_ds.set_logits(logits)
      # Lines 274-320: one epoch of distillation from the FedAvg result.
      net_glob.load_state_dict(copy.deepcopy(w_glob))
      net_glob.train()
      global_wavg = list(net_glob.parameters())  # line 278: aliases the live parameters
      if code.defects == "fixed":
        global_wavg = [p.detach().clone() for p in global_wavg]
      public_dl = DataLoader(
        public_ds, batch_size=hp["distill_batch_size"], shuffle=True, drop_last=False
      )
      optimizer = torch.optim.Adam(net_glob.parameters(), lr=hp["distill_lr"])
      kl = torch.nn.KLDivLoss(reduction="batchmean")
      T, gamma = hp["distill_temperature"], hp["alpha"]
      for _ in range(hp["distill_epochs"]):
        for teacher_x, _, teacher_logits in public_dl:
          net_glob.zero_grad()
          optimizer.zero_grad()
          out = net_glob(teacher_x)
          kd = kl(
            torch.log_softmax(out / T, dim=1), torch.softmax(teacher_logits.float() / T, dim=1)
          )
          reg = 0.0
          for i, p in enumerate(net_glob.parameters()):
            reg += torch.norm(p - global_wavg[i]) ** 2
          (T**2 * kd + gamma * reg).backward()
          optimizer.step()
      w_glob = copy.deepcopy(net_glob.state_dict())
      net_glob.eval()
    _, acc = h["eval_test"](net_glob, args, test_dl)
    acc_curve.append(float(acc))
  out = {
    "accuracy": acc_curve,
    "wall_seconds": time.perf_counter() - t0,
    "cpu_seconds": time.process_time() - cpu0,
  }
  if method == "fedproj":
    out["projected_fraction"], out["mean_cos"] = proj_frac, proj_cos
  return out


def check_logits(inputs: dict) -> float:
  """Max |torch logits − Flax logits| of our ``cnn`` on 64 normalised training images."""
  import torch

  x = np.asarray(inputs["normalize"](inputs["train"][0][:64]))
  flax_logits = np.asarray(inputs["model"].apply(inputs["variables"], x, train=False).logits)
  net = torch_cnn()
  net.load_state_dict(torch_state_from_flax(inputs["variables"]))
  with torch.no_grad():
    t = net(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).numpy()
  return float(np.max(np.abs(t - flax_logits)))


# ---------------------------------------------------------------------------------------------
# Statistics and the report


def summarize(runs: dict, seeds: list[int], window, method_names=("fedavg", "fedproj")) -> dict:
  """Paired differences and the verdict (docs/fedproj.md, "Parity with the authors' code").

  For each method and seed s: d_s = mean over rounds of (authors − ours) test accuracy. The
  codes agree "within seed noise" when the 95% t-interval of mean(d) over seeds lies inside
  ±noise, noise = sqrt(σ_a² + σ_o²), σ_code the between-seed standard deviation of that code's
  round-averaged accuracy: the spread of the difference of two runs of one code at two seeds.
  The interval entirely outside ±noise (with 0 outside it) is "differ"; anything else is
  "inconclusive".
  """
  from fedjax_proj.reproduce import stats

  out = {}
  for m in method_names:
    if not all((m, code, s) in runs for code in ("authors", "ours") for s in seeds):
      continue
    curve = lambda code, s, m=m: np.asarray(runs[(m, code, s)]["accuracy"])
    d = [float(np.mean(curve("authors", s) - curve("ours", s))) for s in seeds]
    p = stats.paired(d)
    sig = {
      c: stats.mean_std([float(np.mean(curve(c, s))) for s in seeds])[1]
      for c in ("authors", "ours")
    }
    noise = math.sqrt(sig["authors"] ** 2 + sig["ours"] ** 2)
    if -noise <= p.low and p.high <= noise:
      verdict = "within seed noise"
    elif (p.low > noise or p.high < -noise) and not p.low <= 0 <= p.high:
      verdict = "differ"
    else:
      verdict = "inconclusive"
    per_round = np.mean([curve("authors", s) - curve("ours", s) for s in seeds], axis=0)
    out[m] = {
      "per_seed_mean_diff": d,
      "per_round_mean_diff": per_round.tolist(),
      "mean_abs_round_diff": float(
        np.mean([np.mean(np.abs(curve("authors", s) - curve("ours", s))) for s in seeds])
      ),
      "paired": p._asdict(),
      "seed_sd": sig,
      "noise": noise,
      "verdict": verdict,
      "wall_ratio_authors_over_ours": _time_ratio(runs, m, seeds, "wall_seconds"),
      # Results recorded before CPU time was measured have none.
      "cpu_ratio_authors_over_ours": _time_ratio(runs, m, seeds, "cpu_seconds"),
      # Ours without the seconds it spent compiling (the authors' eager torch compiles nothing):
      # what the ratio is once the programs are built, as in every run after a process's first
      # with the persistent compilation cache.
      "cpu_ratio_authors_over_ours_without_compile": _time_ratio(
        runs, m, seeds, "cpu_seconds", minus="compile_seconds"
      ),
      "compile_seconds_ours": [runs[(m, "ours", s)].get("compile_seconds") for s in seeds],
    }
  if "fedavg" in out and "fedproj" in out:
    gains = {}
    for code in ("authors", "ours"):
      g = [
        float(
          np.mean(
            np.asarray(runs[("fedproj", code, s)]["accuracy"])
            - np.asarray(runs[("fedavg", code, s)]["accuracy"])
          )
        )
        for s in seeds
      ]
      gains[code] = {"per_seed": g, "paired": stats.paired(g)._asdict()}
    out["fedproj_gain"] = gains
  if all(("fedproj", code, s) in runs for code in ("authors", "ours") for s in seeds):
    proj = {}
    for code in ("authors", "ours"):
      fr, cs = [], []
      for s in seeds:
        r = runs[("fedproj", code, s)]
        for t in range(window[0], min(window[1], len(r["accuracy"]))):
          if r["projected_fraction"][t] is not None:
            fr.append(r["projected_fraction"][t])
            cs.append(r["mean_cos"][t])
      proj[code] = {
        "projected_fraction": float(np.mean(fr)) if fr else None,
        "mean_cos": float(np.mean(cs)) if cs else None,
      }
    out["projection"] = proj
  return out


def _time_ratio(
  runs: dict, method: str, seeds: list[int], key: str, minus: str = ""
) -> float | None:
  """Authors' summed ``key`` seconds over ours for ``method``, ours less its ``minus`` seconds
  where given; None when a run lacks ``key`` (or ours lacks ``minus``)."""
  if not all(key in runs[(method, who, s)] for who in ("authors", "ours") for s in seeds):
    return None
  if minus and not all(minus in runs[(method, "ours", s)] for s in seeds):
    return None
  total = lambda who: sum(runs[(method, who, s)][key] for s in seeds)  # noqa: E731
  less = sum(runs[(method, "ours", s)][minus] for s in seeds) if minus else 0.0
  return float(total("authors") / (total("ours") - less))


def markdown(result: dict) -> str:
  seeds, summary, runs = result["seeds"], result["summary"], result["runs"]
  lines = [
    f"# FedProj parity with the authors' code (defects: {result['defects']})",
    "",
    f"Generated by `{result['command']}` at commit {result['commit']}; our persistent "
    f"compilation cache: {result.get('compilation_cache', 'off')}.",
    "Test accuracy (%) per round;",
    f"projection window (0-based rounds) {result['proj_rounds']}; torch logits vs Flax max |diff| "
    f"{result['logits_max_abs_diff']:.2e}.",
    "",
    "| method | code | seed | per-round test accuracy | mean over rounds | final | wall s "
    "| CPU s | compile s |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for m in ("fedavg", "fedproj"):
    for code in ("authors", "ours"):
      for s in seeds:
        r = runs.get(f"{m}/{code}/{s}")
        if r is None:
          continue
        acc = r["accuracy"]
        lines.append(
          f"| {m} | {code} | {s} | {' '.join(f'{a:.1f}' for a in acc)} | {np.mean(acc):.2f} | "
          f"{acc[-1]:.2f} | {r['wall_seconds']:.0f} | "
          + (f"{r['cpu_seconds']:.0f} |" if "cpu_seconds" in r else "- |")
          + (f" {r['compile_seconds']:.1f} |" if "compile_seconds" in r else " - |")
        )
  lines += [
    "",
    "Paired difference d_s = mean over rounds of (authors − ours); 95% t-interval over seeds;",
    "noise = sqrt(σ_authors² + σ_ours²) of the round-averaged accuracy over seeds",
    "(docs/fedproj.md, the section on parity with the authors' code).",
    "",
    "| method | d per seed | mean d [95% CI] | mean abs per-round diff | noise | verdict "
    "| wall ratio authors/ours | CPU ratio authors/ours | CPU ratio, ours less compiling |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for m in ("fedavg", "fedproj"):
    v = summary.get(m)
    if v is None:
      continue
    p = v["paired"]
    lines.append(
      f"| {m} | {', '.join(f'{d:+.2f}' for d in v['per_seed_mean_diff'])} | {p['mean']:+.2f} "
      f"[{p['low']:+.2f}, {p['high']:+.2f}] | {v['mean_abs_round_diff']:.2f} | {v['noise']:.2f} | "
      f"{v['verdict']} | {v['wall_ratio_authors_over_ours']:.2f} | "
      + (f"{r:.2f} |" if (r := v.get("cpu_ratio_authors_over_ours")) is not None else "- |")
      + (
        f" {r:.2f} |"
        if (r := v.get("cpu_ratio_authors_over_ours_without_compile")) is not None
        else " - |"
      )
    )
  if "fedproj_gain" in summary:
    lines += [
      "",
      "| FedProj − FedAvg (mean over rounds) | per seed | mean [95% CI] |",
      "|---|---|---|",
    ]
    for code, g in summary["fedproj_gain"].items():
      p = g["paired"]
      lines.append(
        f"| {code} | {', '.join(f'{x:+.2f}' for x in g['per_seed'])} | {p['mean']:+.2f} "
        f"[{p['low']:+.2f}, {p['high']:+.2f}] |"
      )
  if "projection" in summary:
    lines += [
      "",
      "| projection (rounds in the window) | steps projected | mean cos(g_new, g_mem) |",
      "|---|---|---|",
    ]
    for code, v in summary["projection"].items():
      fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
      lines.append(f"| {code} | {fmt(v['projected_fraction'])} | {fmt(v['mean_cos'])} |")
  return "\n".join(lines) + "\n"


def merge(paths: list[Path], out_dir: Path) -> dict:
  """Combines result files of the same budget and defects run over disjoint seeds."""
  parts = [json.loads(p.read_text()) for p in paths]
  first = parts[0]
  for p in parts[1:]:
    for key in ("defects", "proj_rounds", "budget"):
      if p[key] != first[key]:
        raise ValueError(f"cannot merge runs with different {key}: {first[key]} vs {p[key]}")
  runs, seeds = {}, []
  for p in parts:
    for key, value in p["runs"].items():
      m, code, s = key.split("/")
      if (m, code, int(s)) in runs:
        raise ValueError(f"seed {s} of {m} ({code}) appears in two files")
      runs[(m, code, int(s))] = value
    seeds += [s for s in p["seeds"] if s not in seeds]
  seeds = sorted(seeds)
  methods = sorted({m for m, _, _ in runs})
  result = {
    **first,
    "command": " ; ".join(p["command"] for p in parts),
    "commit": ", ".join(sorted({p["commit"] for p in parts})),
    "seeds": seeds,
    "logits_max_abs_diff": max(p["logits_max_abs_diff"] for p in parts),
    "runs": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in sorted(runs.items())},
    "summary": summarize(runs, seeds, tuple(first["proj_rounds"]), methods),
  }
  out_dir.mkdir(parents=True, exist_ok=True)
  write_results(out_dir / f"parity_{first['defects']}.json", result, markdown=markdown(result))
  print(markdown(result))
  return result


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
  ap.add_argument("--authors_repo", default="", help="checkout of Abhijit4-debug/FedProj_Neurips")
  ap.add_argument("--data_dir", default=str(ROOT.parent / "shared" / "data" / "cifar10"))
  ap.add_argument(
    "--public_data", default=str(ROOT.parent / "shared" / "data" / "cifar100" / "public_20k.npz")
  )
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--methods", default="fedavg,fedproj")
  ap.add_argument("--train_subset", type=int, default=2000)
  ap.add_argument("--test_subset", type=int, default=1000)
  ap.add_argument("--num_clients", type=int, default=10)
  ap.add_argument("--clients_per_round", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=8)
  ap.add_argument("--local_epochs", type=int, default=2)
  ap.add_argument("--partition", default="dirichlet:0.3")
  ap.add_argument("--public_size", type=int, default=512, help="public subset = the memory")
  ap.add_argument(
    "--proj_rounds", default="", help="start:stop (0-based); default: the code's scaled"
  )
  ap.add_argument("--defects", default="code", choices=DEFECTS)
  ap.add_argument("--torch_threads", type=int, default=1)
  ap.add_argument(
    "--compilation_cache",
    default="off",
    help="our side's persistent compilation cache: a folder (as our entry points use one by "
    "default: a run after the first loads its programs) or off (default: off, as the earlier "
    "results ran)",
  )
  ap.add_argument("--out", default=str(RESULTS_DIR / "parity"))
  ap.add_argument(
    "--merge",
    default="",
    help="comma-separated result JSONs of runs over disjoint seeds (e.g. one process per core): "
    "writes their combined table to --out instead of running",
  )
  args = ap.parse_args(argv)
  if args.merge:
    return merge([Path(p) for p in args.merge.split(",")], Path(args.out))
  # The lists and counts, then (below) the checkout and torch, before anything loads or runs.
  from benchmarks import flag_checks

  methods = flag_checks.names(ap, "--methods", args.methods, ("fedavg", "fedproj"))
  seeds = flag_checks.seeds(ap, "--seeds", args.seeds)
  flag_checks.at_least(ap, args, 1, "rounds", "local_epochs", "num_clients", "clients_per_round")
  flag_checks.at_least(ap, args, 1, "public_size", "torch_threads")
  flag_checks.at_least(ap, args, 0, "train_subset", "test_subset")  # 0: the whole set
  try:
    proj_window(args)
  except ValueError:
    ap.error(f"--proj_rounds must be start:stop, two integers, e.g. 1:7; got {args.proj_rounds}")
  # What our entry points do first (docs/performance.md, "The step's page faults"), so our side
  # runs as a user's run does; torch shares the process's malloc settings.
  from benchmarks.perf import cpu_step

  kept = cpu_step.keep_freed_memory()
  from fedjax_proj.training import compilation_cache

  try:
    cache = compilation_cache.enable(args.compilation_cache)
  except ValueError as e:
    ap.error(str(e))
  repo = Path(args.authors_repo)
  if not args.authors_repo or not (repo / "src" / "client" / "client_fedproj.py").is_file():
    ap.error(
      f"--authors_repo={repo} has no src/client/client_fedproj.py; clone "
      "Abhijit4-debug/FedProj_Neurips there."
    )
  authors_commit = checkout_commit(repo)
  if authors_commit != REFERENCES["fedproj"].commit:
    # Recorded either way; the pinned commit is the one docs/parity.md's row names.
    print(
      f"note: {repo} is at commit {authors_commit or 'unknown'}, the suite pins "
      f"{REFERENCES['fedproj'].commit[:12]}; the result records it",
      file=sys.stderr,
    )
  torch = flag_checks.require_torch(ap, "parity")
  torch.set_num_threads(args.torch_threads)
  window = proj_window(args)
  code = AuthorsCode(repo, args.defects)
  runs, logits_diff = {}, 0.0
  out_dir = Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  result = {
    "command": "python -m benchmarks.parity.fedproj "
    + " ".join(argv if argv is not None else sys.argv[1:]),
    "commit": _commit(),
    "authors_commit": authors_commit,
    # The parts of keep_freed_memory that could not apply (empty: both did).
    "keep_freed_memory": kept,
    "compilation_cache": str(cache) if cache is not None else "off",
    "defects": args.defects,
    "seeds": seeds,
    "proj_rounds": list(window),
    "budget": {
      k: getattr(args, k)
      for k in (
        "train_subset",
        "test_subset",
        "num_clients",
        "clients_per_round",
        "rounds",
        "local_epochs",
        "partition",
        "public_size",
      )
    },
    "torch": torch.__version__,
  }
  with tempfile.TemporaryDirectory() as tmp:
    for i, s in enumerate(seeds):
      for j, m in enumerate(methods):
        c = our_config(m, s, args, os.path.join(tmp, f"{m}-{s}"))
        inputs = export_inputs(c)
        logits_diff = max(logits_diff, check_logits(inputs))
        order = ("ours", "authors") if (i + j) % 2 == 0 else ("authors", "ours")  # alternate
        for who in order:
          r = run_ours(c) if who == "ours" else run_authors(code, m, inputs, c, window)
          runs[(m, who, s)] = r
          print(
            f"seed {s} {m} {who}: final {r['accuracy'][-1]:.2f} wall {r['wall_seconds']:.0f}s",
            flush=True,
          )
        result.update(
          logits_max_abs_diff=logits_diff,
          runs={f"{k[0]}/{k[1]}/{k[2]}": v for k, v in runs.items()},
          summary=summarize(runs, seeds, window, [m for m in methods]),
        )
        # Partial results after every pair, so an interrupted run keeps what it measured.
        write_results(out_dir / f"parity_{args.defects}.json", result)
  write_results(out_dir / f"parity_{args.defects}.json", result, markdown=markdown(result))
  print(markdown(result))


if __name__ == "__main__":
  main()
