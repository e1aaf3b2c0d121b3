"""Peer runner: a plain PyTorch FedAvg loop, the one a PyTorch user writes without a framework.

    $PEER_ENVS/torch/bin/python -m benchmarks.perf.peer.torch_loop --export <workload.npz>

The FedAvg CNN in torch (the layers and parameter count of fedjax_proj.models.cnn: 2,156,490 on
CIFAR-10), plain SGD, for each sampled client: load the global weights, run one shuffled epoch in
batches (the last one partial), then average the clients' weights by example count (McMahan et
al. 2017, FedAvg; the baseline of 002 §5). Intra-op threads follow OMP_NUM_THREADS (the driver sets
1 in the one-core mode).
"""

from __future__ import annotations

import time

from benchmarks.perf.peer.common import Recorder, normalize, runner_args


def main(argv=None) -> None:
  args, export = runner_args(argv)
  rec = Recorder("torch", export, args.out)
  # --- user code
  import numpy as np
  import torch
  import torch.nn as nn

  s = export["settings"]
  device = torch.device("cuda" if args.device in ("cuda", "gpu") else "cpu")
  torch.manual_seed(s["seed"])
  model = nn.Sequential(
    nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(8 * 8 * 64, 512), nn.ReLU(), nn.Linear(512, 10),
  ).to(device)  # fmt: skip
  # NCHW float32 once, on the device: each client's batches are then index lookups.
  x_all = torch.from_numpy(normalize(export["train_x"]).transpose(0, 3, 1, 2).copy()).to(device)
  y_all = torch.from_numpy(export["train_y"]).to(device)
  rng = np.random.default_rng(s["seed"])
  loss_fn = nn.CrossEntropyLoss()
  for r in range(args.rounds):
    rec.begin()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    total = {k: torch.zeros_like(v) for k, v in global_state.items()}
    n_total, losses = 0, []
    for c in export["cohorts"][r]:
      model.load_state_dict(global_state)
      opt = torch.optim.SGD(model.parameters(), lr=args.lr)
      data = export["clients"][c]
      for _ in range(s["local_epochs"]):
        order = torch.from_numpy(rng.permutation(data)).to(device)
        for i in range(0, len(order), s["batch_size"]):
          idx = order[i : i + s["batch_size"]]
          opt.zero_grad()
          loss = loss_fn(model(x_all[idx]), y_all[idx])
          loss.backward()
          opt.step()
          losses.append(loss.detach())
      with torch.no_grad():
        for k, v in model.state_dict().items():
          total[k] += len(data) * v
      n_total += len(data)
    model.load_state_dict({k: v / n_total for k, v in total.items()})
    train_loss = float(torch.stack(losses).mean())  # also waits for a device's queued work
    rec.end(r, train_loss=train_loss)
  model.eval()
  with torch.no_grad():
    x_test = torch.from_numpy(normalize(export["test_x"]).transpose(0, 3, 1, 2).copy()).to(device)
    pred = torch.cat([model(x_test[i : i + 500]).argmax(-1) for i in range(0, len(x_test), 500)])
    correct = int((pred.cpu().numpy() == export["test_y"]).sum())
  # --- end user code
  rec.finish(
    correct / len(export["test_y"]),
    __file__,
    framework=f"torch {torch.__version__}",
    torch_threads=torch.get_num_threads(),
    wall_clock=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  )


if __name__ == "__main__":
  main()
