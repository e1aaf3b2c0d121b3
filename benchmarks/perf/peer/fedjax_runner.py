"""Peer runner: Google's fedjax 0.0.17 (github.com/google/fedjax), its FedAvg with a haiku CNN.

    $PEER_ENVS/fedjax/bin/python -m benchmarks.perf.peer.fedjax_runner --export <workload.npz>

fedjax is unmaintained since 2023 and breaks on current jax; make_envs.sh pins the last versions
it was seen to run on (jax 0.4.30, dm-haiku 0.0.12, optax 0.2.2). ``federated_averaging`` with
SGD clients and a server SGD of learning rate 1 averages the clients' deltas by example count
(McMahan et al. 2017), so the new global model is the example-weighted mean, as in the other
runners. Each client's ``shuffle_repeat_batch`` keeps the last, partial batch, which fedjax jits
anew for every batch size it meets (a cost of the framework, left in). The module is not named
``fedjax`` so that ``import fedjax`` finds the package.
"""

from __future__ import annotations

import time

from benchmarks.perf.peer.common import Recorder, normalize, runner_args


def main(argv=None) -> None:
  args, export = runner_args(argv)
  rec = Recorder("fedjax", export, args.out)
  # --- user code
  import fedjax
  import haiku as hk
  import jax
  import jax.numpy as jnp
  import numpy as np

  s = export["settings"]

  def forward(batch):
    x = batch["x"]
    for width in (32, 64):
      x = jax.nn.relu(hk.Conv2D(width, 5, padding="SAME")(x))
      x = hk.max_pool(x, 2, 2, "VALID")
    x = jax.nn.relu(hk.Linear(512)(hk.Flatten()(x)))
    return hk.Linear(10)(x)

  x_all, y_all = normalize(export["train_x"]), export["train_y"].astype(np.int32)
  model = fedjax.create_model_from_haiku(
    hk.transform(forward),
    {"x": x_all[:1], "y": y_all[:1]},
    train_loss=lambda b, p: fedjax.metrics.unreduced_cross_entropy_loss(b["y"], p),
    eval_metrics={"accuracy": fedjax.metrics.Accuracy()},
  )
  algorithm = fedjax.algorithms.fed_avg.federated_averaging(
    grad_fn=fedjax.model_grad(model),
    client_optimizer=fedjax.optimizers.sgd(args.lr),
    server_optimizer=fedjax.optimizers.sgd(1.0),
    client_batch_hparams=fedjax.ShuffleRepeatBatchHParams(
      batch_size=s["batch_size"], num_epochs=s["local_epochs"], drop_remainder=False
    ),
  )
  key = jax.random.PRNGKey(s["seed"])
  state = algorithm.init(model.init(key))
  for r in range(args.rounds):
    rec.begin()
    clients = []
    for c in export["cohorts"][r]:
      idx = export["clients"][c]
      data = fedjax.ClientDataset({"x": x_all[idx], "y": y_all[idx]})
      clients.append((str(c).encode(), data, jax.random.fold_in(key, r * 100_000 + int(c))))
    state, _ = algorithm.apply(state, clients)
    jax.block_until_ready(state.params)
    rec.end(r)
  test = fedjax.ClientDataset({"x": normalize(export["test_x"]),
                               "y": export["test_y"].astype(np.int32)})  # fmt: skip
  out = fedjax.evaluate_model(model, state.params, test.batch(fedjax.BatchHParams(500)))
  accuracy = float(jnp.asarray(out["accuracy"]))
  # --- end user code
  rec.finish(
    accuracy,
    __file__,
    framework=f"fedjax 0.0.17 (jax {jax.__version__})",
    wall_clock=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  )


if __name__ == "__main__":
  main()
