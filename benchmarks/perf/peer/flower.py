"""Peer runner: Flower's simulation (``flwr[simulation]``, Ray), with a PyTorch client.

    $PEER_ENVS/flower/bin/python -m benchmarks.perf.peer.flower --export <workload.npz>

One virtual SuperNode per exported client (``run_simulation``), a ServerApp running Flower's
``FedAvg`` strategy (the clients' models averaged by their ``num-examples``, McMahan et al. 2017),
and a ClientApp that trains the received model for one shuffled epoch of plain SGD. The strategy's
``configure_train`` is overridden to send each round to the exported cohort, telling each node
which client's data to train on; client-side evaluation is off (``fraction_evaluate=0``). The
ServerApp's ``evaluate_fn`` hook, called after every round's aggregation, marks the round
boundaries; the last call measures the test accuracy. Ray's worker processes are descendants of
this one, so their CPU seconds and PSS count (benchmarks/perf/peer/common.py).
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np
import torch
import torch.nn as nn
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from benchmarks.perf.peer.common import Recorder, load_export, normalize, runner_args

# --- user code (the imports above count as 7 lines: functools, os, numpy, torch, nn, flwr x2)


def make_net():
  return nn.Sequential(
    nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(8 * 8 * 64, 512), nn.ReLU(), nn.Linear(512, 10),
  )  # fmt: skip


@functools.cache
def client_data(path: str, device: str):
  """Each Ray worker reads the export once and keeps it on its device (the handler runs anew for
  every message)."""
  export = load_export(path)
  x = torch.from_numpy(normalize(export["train_x"]).transpose(0, 3, 1, 2).copy())
  return export, x.to(device), torch.from_numpy(export["train_y"]).to(device)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context) -> Message:
  cfg = msg.content["config"]
  device = str(cfg["device"])
  export, x_all, y_all = client_data(str(cfg["export"]), device)
  net = make_net().to(device)
  net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
  opt = torch.optim.SGD(net.parameters(), lr=float(cfg["lr"]))
  data = export["clients"][int(cfg["client"])]
  rng = np.random.default_rng([int(cfg["client"]), int(cfg["server-round"])])
  for _ in range(int(cfg["local-epochs"])):
    order = torch.from_numpy(rng.permutation(data)).to(device)
    for i in range(0, len(order), int(cfg["batch-size"])):
      idx = order[i : i + int(cfg["batch-size"])]
      opt.zero_grad()
      loss = nn.functional.cross_entropy(net(x_all[idx]), y_all[idx])
      loss.backward()
      opt.step()
  content = RecordDict({
    "arrays": ArrayRecord(net.state_dict()),
    "metrics": MetricRecord({"num-examples": len(data), "train_loss": loss.item()}),
  })  # fmt: skip
  return Message(content=content, reply_to=msg)


# --- end user code


def main(argv=None) -> None:
  args, export = runner_args(argv)
  rec = Recorder("flower", export, args.out)
  result = {}
  # --- user code
  from flwr.serverapp import Grid, ServerApp
  from flwr.serverapp.strategy import FedAvg
  from flwr.simulation import run_simulation

  s = export["settings"]
  torch.manual_seed(s["seed"])
  device = "cuda" if args.device in ("cuda", "gpu") else "cpu"

  class ReplayFedAvg(FedAvg):
    """FedAvg sending round r to the exported cohort r instead of sampling nodes itself."""

    def configure_train(self, server_round, arrays, config, grid: Grid):
      nodes = sorted(grid.get_node_ids())
      messages = []
      for c in export["cohorts"][server_round - 1]:
        cfg = ConfigRecord({
          "client": int(c), "server-round": server_round, "lr": args.lr,
          "batch-size": s["batch_size"], "local-epochs": s["local_epochs"],
          "export": os.path.abspath(args.export), "device": device,
        })  # fmt: skip
        record = RecordDict({"arrays": arrays, "config": cfg})
        messages.append(Message(record, dst_node_id=nodes[c], message_type=MessageType.TRAIN))
      return messages

    def aggregate_train(self, server_round, replies):
      replies = list(replies)
      failed = [m.error for m in replies if m.has_error()]
      if failed:  # FedAvg would average the rest; a benchmark must not
        raise RuntimeError(f"round {server_round}: {len(failed)} clients failed: {failed[0]}")
      return super().aggregate_train(server_round, replies)

  x_test = torch.from_numpy(normalize(export["test_x"]).transpose(0, 3, 1, 2).copy())

  def round_hook(server_round: int, arrays: ArrayRecord):
    if server_round > 0:
      rec.end(server_round - 1)
    if server_round < args.rounds:
      rec.begin()
      return None
    net = make_net()
    net.load_state_dict(arrays.to_torch_state_dict())
    net.eval()
    with torch.no_grad():
      pred = torch.cat([net(x_test[i : i + 500]).argmax(-1) for i in range(0, len(x_test), 500)])
    result["accuracy"] = float((pred.numpy() == export["test_y"]).mean())
    return MetricRecord({"accuracy": result["accuracy"]})

  server_app = ServerApp()

  @server_app.main()
  def server_main(grid: Grid, context) -> None:
    strategy = ReplayFedAvg(fraction_evaluate=0.0, min_available_nodes=s["num_clients"])
    strategy.start(grid, ArrayRecord(make_net().state_dict()), args.rounds, evaluate_fn=round_hook)

  cpus = len(os.sched_getaffinity(0))  # Ray counts every core, pinned or not
  gpus = 0.1 if device == "cuda" else 0.0  # on a GPU, up to 10 clients share it at once
  run_simulation(
    server_app=server_app,
    client_app=client_app,
    num_supernodes=s["num_clients"],
    backend_config={"client_resources": {"num_cpus": 1, "num_gpus": gpus},
                    "init_args": {"num_cpus": cpus}},
  )  # fmt: skip
  # --- end user code
  import flwr

  rec.finish(
    result["accuracy"],
    __file__,
    framework=f"flwr {flwr.__version__} (torch {torch.__version__})",
    ray_cpus=cpus,
    wall_clock=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  )


if __name__ == "__main__":
  # Run from the imported module, not __main__: Ray's workers unpickle the ClientApp's functions
  # by module name, and only ``benchmarks.perf.peer.flower`` is importable there.
  from benchmarks.perf.peer import flower

  flower.main()
