"""The one method registry: typed specs for every family, clear errors, family Protocols checked."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
import pytest

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.families import ContinualFamily, FLFamily, SequentialFamily
from fedjax_proj.algorithms.fedavg import fedavg
from fedjax_proj.core.executor import Executor
from fedjax_proj.models.multihead import multi_head
from tests import helpers

build_fedavg = registry.spec("fedavg").build


def _ctx(**extra) -> registry.BuildContext:
  model = helpers.tiny_model()
  x, _ = helpers.synthetic_data(n=8)
  return registry.BuildContext(
    model=model,
    client_optimizer=optax.sgd(0.1),
    executor=Executor("vmap_scan", helpers.float_batch_fn()),
    normalize=lambda v: v,
    num_clients=4,
    num_classes=3,
    variables=model.init(jax.random.key(0), jnp.asarray(x[:2])),
    sample_x=jnp.asarray(x[:2]),
    num_tasks=2,
    **extra,
  )


def test_every_name_has_one_spec_of_a_known_family():
  everything = registry.methods(registry.FAMILIES)
  assert set(everything) == set(registry.METHODS)
  for name in everything:
    spec = registry.spec(name)
    assert spec.name == name and spec.family in registry.FAMILIES
  assert registry.methods(("continual",)) == (
    "fl",
    "ewc",
    "er",
    "rgo",
    "gpm",
    "glfc",
    "fedcil",
    "fot",
  )
  assert set(registry.methods(("sequential",))) == {
    "fedseq",
    "cwc",
    "sfedkd",
    "fedseq_aver",
    "fedseq_ebkd",
    "fedseq_camkd",
  }
  # The default lists what the one-task experiment runner accepts: no continual method.
  assert set(registry.methods()) == set(everything) - set(registry.methods(("continual",)))
  # The run's memory size, and whether the server logs its L_mem drift (the claim reports do).
  assert registry.spec("fedproj").needs_public and registry.spec("fedproj").config_kwargs == (
    "memory_size",
    "lmem_global",
  )
  assert registry.model_kwargs("moon") == {"projection_dim": 256, "classifier_on_projection": True}


@pytest.mark.parametrize(
  ("name", "protocol", "not_protocol"),
  [
    ("fedavg", FLFamily, SequentialFamily),
    ("fedgkd_vote", FLFamily, SequentialFamily),
    ("fedseq", SequentialFamily, FLFamily),
    ("ewc", ContinualFamily, FLFamily),
    ("er", ContinualFamily, FLFamily),
  ],
)
def test_builds_meet_their_family_protocol(name, protocol, not_protocol):
  built = registry.build_algorithm(name, _ctx())
  assert isinstance(built, protocol)
  assert not isinstance(built, not_protocol)


@pytest.mark.parametrize("name", sorted(registry.METHODS))
def test_every_declared_hyperparameter_is_accepted_by_the_build(name):
  # Passing each declared hyperparameter explicitly (at its default) builds the method: a
  # declaration naming a keyword the factory lacks would raise a TypeError here.
  declared = registry.declared_hparams(name)
  assert declared is not None, f"{name} declares no hyperparameters"
  assert registry.REQUIRED not in declared.values()
  ctx = _ctx(public_size=8, validation_size=4)
  if registry.spec(name).family == "continual":
    model = multi_head("mlp", num_tasks=2, classes_per_task=3, hidden=(8,))
    ctx = ctx._replace(model=model, variables=model.init(jax.random.key(0), ctx.sample_x))
  # The config fields a method reads without a default of its own (FedProj's memory size) come
  # from the run's config.
  config = {"memory_size": ctx.public_size}
  unset = {k: config[k] for k in registry.config_kwargs(name) if k not in declared}
  built = registry.build_algorithm(name, ctx, **declared, **unset)
  assert built is not None
  if unset:
    with pytest.raises(ValueError, match=f"reads the config field.s. {', '.join(unset)}; pass"):
      registry.build_algorithm(name, ctx, **declared)


def test_hyperparameters_come_from_the_factory_signature_minus_the_context():
  from fedjax_proj.algorithms.distillation.fedgkd import fedgkd
  from fedjax_proj.algorithms.fedprox import fedprox

  assert registry.declared_hparams("fedprox") == {"mu": 0.01}
  assert registry.factory_hparams(fedprox) == {"mu": 0.01, "server_optimizer": None}
  assert registry.declared_hparams("fedavg") == {} == registry.declared_hparams("fedseq")
  # What the build fixes per registered name is not a hyperparameter: FedDF cannot be turned
  # into FedET by --method_kwargs, and FedGKD has none of VOTE's weighting knobs.
  assert {"teacher", "name"}.isdisjoint(registry.declared_hparams("feddf"))
  assert "lam" not in registry.declared_hparams("fedgkd")
  assert registry.declared_hparams("fedgkd_vote")["lam"] == 0.1
  assert registry.declared_hparams("sfedkd")["num_teachers"] == 5
  fedproj = registry.declared_hparams("fedproj")
  assert fedproj["memory_batch_size"] == 256 and "public_size" not in fedproj
  with pytest.raises(ValueError, match=r"no parameter\(s\) \['severs_optimizer'\]; fix"):
    registry.factory_hparams(fedgkd, context=("severs_optimizer",))


def test_undeclared_or_mistyped_hyperparameters_fail_before_building():
  with pytest.raises(ValueError, match="unknown key.s. lam for --method=fedgkd; fedgkd accepts: "):
    registry.build_algorithm("fedgkd", _ctx(), lam=0.3)
  with pytest.raises(ValueError, match="buffer_size=2.5 is a float but fedgkd's buffer_size takes"):
    registry.build_algorithm("fedgkd", _ctx(), buffer_size=2.5)
  registry.check_hparams("fedproj", {"tau": 1, "max_coef": 0.5})  # an int for a float: fine
  with pytest.raises(ValueError, match="unknown key.s. beta for --method=cwc; cwc accepts: lam="):
    registry.build_algorithm("cwc", _ctx(), beta=1.0)
  # A spec with undeclared hyperparameters passes them through unchecked.
  spec = registry.MethodSpec("anything_goes", "fl", lambda ctx, **hp: build_fedavg(ctx))
  registry.register(spec)
  try:
    assert registry.declared_hparams("anything_goes") is None
    registry.build_algorithm("anything_goes", _ctx(), whatever=1)
  finally:
    registry.unregister("anything_goes")


def test_a_context_without_a_required_field_is_refused_before_building():
  # One-task methods need no executor in their context; GPM builds batches for its bases and
  # traces the model, so it refuses a context without them.
  bare = _ctx()._replace(executor=None, variables=None, sample_x=None)
  assert registry.build_algorithm("fedavg", bare).name == "fedavg"
  with pytest.raises(ValueError, match="'gpm' needs BuildContext field.s. executor, variables, sa"):
    registry.build_algorithm("gpm", bare)
  with pytest.raises(ValueError, match=r"requires names \['batchfn'\], which are not"):
    registry.MethodSpec("typo", "fl", build_fedavg, requires=("batchfn",))
  with pytest.raises(ValueError, match=r"\['server_optimiser'\] are not BuildContext fields"):
    registry.factory_spec("typo", "fl", fedavg, ctx_kwargs=("server_optimiser",))


def test_unknown_names_and_wrong_families_fail_clearly():
  with pytest.raises(ValueError, match=r"Unknown method 'nope'\. Valid methods: .*fedavg.*fot"):
    registry.build_algorithm("nope", _ctx())
  with pytest.raises(ValueError, match="unknown family 'parallel'"):
    registry.MethodSpec("x", "parallel", build_fedavg)
  with pytest.raises(ValueError, match="already registered"):
    registry.register(registry.MethodSpec("fedavg", "fl", build_fedavg))
  wrong = registry.MethodSpec("fedavg_as_sequential", "sequential", build_fedavg)
  registry.register(wrong)
  try:
    with pytest.raises(TypeError, match="does not meet SequentialFamily"):
      registry.build_algorithm("fedavg_as_sequential", _ctx())
    assert "fedavg_as_sequential" in registry.methods()
  finally:
    registry.unregister("fedavg_as_sequential")
  assert "fedavg_as_sequential" not in registry.methods()


def test_specs_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    registry.spec("fedavg").needs_public = True


def test_each_family_lives_in_its_subpackage():
  """docs/design.md, "Layout": sequential and continual methods live in their family's subpackage,
  distillation methods in distillation/, the other FL methods at the top of algorithms/."""
  distillation = {
    "feddf",
    "feddistill_plus",
    "fedet",
    "fedgen",
    "fedgkd",
    "fedgkd_plus",
    "fedgkd_vote",
    "fedntd",
    "fedproj",
  }
  for name, ref in registry.METHODS.items():
    module = ref.split(":")[0]
    family = registry.spec(name).family
    if family == "fl":
      sub = "distillation" if name in distillation else None
    else:
      sub = family
    want = "fedjax_proj.algorithms." + (f"{sub}." if sub else "")
    rest = module.removeprefix(want)
    assert module.startswith(want) and "." not in rest, f"{name}: {module} is not under {want}"
