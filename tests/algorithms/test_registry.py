"""The one method registry: typed specs for every family, clear errors, family Protocols checked."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
import pytest

from fedjax_proj.algorithms import registry
from fedjax_proj.algorithms.families import ContinualFamily, FLFamily, SequentialFamily
from fedjax_proj.algorithms.fedavg import build as build_fedavg
from tests import helpers


def _ctx(**extra) -> registry.BuildContext:
  model = helpers.tiny_model()
  x, _ = helpers.synthetic_data(n=8)
  return registry.BuildContext(
    model=model,
    client_optimizer=optax.sgd(0.1),
    batch_fn=helpers.float_batch_fn(),
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
  assert registry.methods(("continual",)) == ("fl", "ewc", "er", "gpm", "fot")
  assert set(registry.methods(("sequential",))) == {"fedseq", "cwc", "sfedkd"}
  # The default lists what the one-task experiment runner accepts: no continual method.
  assert set(registry.methods()) == set(everything) - set(registry.methods(("continual",)))
  assert registry.spec("fedproj").needs_public and registry.spec("fedproj").config_kwargs == (
    "memory_size",
  )
  assert registry.model_kwargs("moon") == {"projection_dim": 256}


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
  distillation = {"feddf", "fedet", "fedgkd", "fedgkd_vote", "fedntd", "fedproj"}
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
