"""Peer runner: pfl-research (Apple's ``pfl``, github.com/apple/pfl-research), PyTorch model.

    $PEER_ENVS/pfl/bin/python -m benchmarks.perf.peer.pfl --export <workload.npz>

pfl's ``FederatedAveraging`` on its ``SimulatedBackend``: the clients' model differences are summed
with ``WeightByDatapoints`` (FedAvg's example-count weighting, McMahan et al. 2017) and applied by
a central SGD of learning rate 1, so the new global model is the example-weighted mean of the
clients' models, as in the other runners. Local training is pfl's own loop over a fresh
``torch.optim.SGD``. The user sampler replays the exported cohorts in order; each client's examples
are shuffled when pfl asks for its dataset (pfl itself iterates a dataset in its stored order).
"""

from __future__ import annotations

import time

from benchmarks.perf.peer.common import Recorder, normalize, runner_args


def main(argv=None) -> None:
  args, export = runner_args(argv)
  rec = Recorder("pfl", export, args.out)
  # --- user code
  import numpy as np
  import pfl
  import torch
  import torch.nn as nn
  from pfl.aggregate.simulate import SimulatedBackend
  from pfl.aggregate.weighting import WeightByDatapoints
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.callback.base import TrainingProcessCallback
  from pfl.data.dataset import Dataset
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.hyperparam import NNTrainHyperParams
  from pfl.metrics import Metrics, Weighted
  from pfl.model.pytorch import PyTorchModel

  s = export["settings"]
  torch.manual_seed(s["seed"])

  class CNN(nn.Sequential):
    def loss(self, x, y, eval=False):  # noqa: A002 - pfl's keyword
      self.eval() if eval else self.train()
      return nn.functional.cross_entropy(self(x), y.long())  # pfl hands labels as float

    def metrics(self, x, y, eval=False):  # noqa: A002
      with torch.no_grad():
        loss = self.loss(x, y, eval).item()
      return {"loss": Weighted(loss * len(y), len(y))}

  net = CNN(
    nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(8 * 8 * 64, 512), nn.ReLU(), nn.Linear(512, 10),
  )  # fmt: skip
  model = PyTorchModel(
    model=net,
    local_optimizer_create=torch.optim.SGD,
    central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
  )
  x_all = normalize(export["train_x"]).transpose(0, 3, 1, 2).copy()
  y_all = export["train_y"]
  rng = np.random.default_rng(s["seed"])

  def make_dataset(user_id):
    idx = rng.permutation(export["clients"][user_id])
    return Dataset(raw_data=[x_all[idx], y_all[idx]], user_id=user_id)

  cohorts = iter(export["cohorts"][: args.rounds].reshape(-1).tolist())
  train_data = FederatedDataset(make_dataset, user_sampler=lambda: next(cohorts))

  class Timer(TrainingProcessCallback):
    def on_train_begin(self, *, model):
      rec.begin()
      return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
      rec.end(central_iteration)
      if central_iteration + 1 < args.rounds:
        rec.begin()
      return False, Metrics()

  FederatedAveraging().run(
    algorithm_params=NNAlgorithmParams(
      central_num_iterations=args.rounds,
      evaluation_frequency=args.rounds + 1,
      train_cohort_size=s["clients_per_round"],
      val_cohort_size=None,
    ),
    backend=SimulatedBackend(train_data, None, postprocessors=[WeightByDatapoints()]),
    model=model,
    model_train_params=NNTrainHyperParams(
      local_batch_size=s["batch_size"],
      local_num_epochs=s["local_epochs"],
      local_learning_rate=args.lr,
    ),
    callbacks=[Timer()],
  )
  net.eval()
  with torch.no_grad():
    x_test = torch.from_numpy(normalize(export["test_x"]).transpose(0, 3, 1, 2).copy())
    x_test = x_test.to(next(net.parameters()).device)  # pfl put the model on its default device
    pred = torch.cat([net(x_test[i : i + 500]).argmax(-1) for i in range(0, len(x_test), 500)])
  correct = int((pred.cpu().numpy() == export["test_y"]).sum())
  # --- end user code
  rec.finish(
    correct / len(export["test_y"]),
    __file__,
    framework=f"pfl {pfl.__version__} (torch {torch.__version__})",
    torch_threads=torch.get_num_threads(),
    wall_clock=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  )


if __name__ == "__main__":
  main()
