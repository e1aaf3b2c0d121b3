"""Peer runner: ours, fedjax_proj's public API as a user writes it (the README's quick start).

    python -m benchmarks.perf.peer.ours --export results/peer/workload.npz --rounds 4

FedAvg (McMahan et al. 2017; the baseline of 002 §5 and 004 §5) with the FedAvg CNN, plain SGD,
over the exported clients and cohorts. The convolution implementation and execution strategy are
the library's defaults for this backend (``conv_impl_for``, ``choose_strategy("auto")``,
docs/performance.md); both are named in the summary line. Batches are drawn by our own
``FederatedData`` (each epoch a fresh shuffle, the last batch partial and masked).
"""

from __future__ import annotations

import time

from benchmarks.perf.peer.common import Recorder, runner_args


def main(argv=None) -> None:
  args, export = runner_args(argv)
  rec = Recorder("ours", export, args.out)
  # --- user code
  import jax
  import numpy as np
  import optax

  from fedjax_proj.algorithms.base import make_round
  from fedjax_proj.algorithms.fedavg import fedavg
  from fedjax_proj.core.engine import choose_strategy
  from fedjax_proj.data.federated import FederatedData
  from fedjax_proj.data.pipeline import make_batch_fn, normalizer_for
  from fedjax_proj.models import get_model
  from fedjax_proj.training.placement import conv_impl_for

  s = export["settings"]
  conv_impl = conv_impl_for()  # oneDNN's convolutions on CPU where they load, else XLA's
  model = get_model("cnn", 10, conv_impl=conv_impl)
  normalize = normalizer_for("cifar10")
  key = jax.random.key(s["seed"])
  variables = model.init(key, normalize(export["train_x"][:2]))
  alg = fedavg(model, optax.sgd(args.lr))
  state = alg.init(variables, key)
  strategy = choose_strategy("auto", has_conv=True, num_clients=s["clients_per_round"])
  round_fn = make_round(alg, strategy, make_batch_fn(normalize))
  fed = FederatedData(export["clients"], batch_size=s["batch_size"], local_epochs=s["local_epochs"])
  images, labels = jax.device_put(export["train_x"]), jax.device_put(export["train_y"])
  for r in range(args.rounds):
    rec.begin()
    clients = export["cohorts"][r]
    round_data = fed.round_data(images, labels, clients, r, seed=s["seed"], extra={})
    state, metrics = round_fn(state, round_data, jax.random.fold_in(key, r))
    jax.block_until_ready(state)
    rec.end(r, train_loss=float(metrics["train_loss"]))
  params = alg.global_variables(state)
  apply = jax.jit(lambda v, x: model.apply(v, normalize(x), train=False).logits)
  x_test, y_test = export["test_x"], export["test_y"]
  pred = np.concatenate([np.argmax(apply(params, x_test[i : i + 500]), -1)
                         for i in range(0, len(y_test), 500)])  # fmt: skip
  correct = int(np.sum(pred == y_test))
  # --- end user code
  rec.finish(
    correct / len(export["test_y"]),
    __file__,
    framework=f"fedjax_proj (jax {jax.__version__}, {jax.default_backend()})",
    conv_impl=conv_impl,
    strategy=strategy,
    wall_clock=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  )


if __name__ == "__main__":
  main()
