"""Every experiment family's config module has the one protocol (docs/design.md, "The package and
the checkout"): ``get_config(preset)``, ``prepare(config)``, ``resolve(preset, fields,
method_kwargs)`` and ``main(argv)``, and holds presets only: no trainer, no benchmark builder."""

from __future__ import annotations

import importlib
import inspect

import pytest

from fedjax_proj.configs import FAMILIES

# Positional arguments each protocol function must accept (further ones must have defaults).
PROTOCOL = {
  "get_config": ("preset",),
  "prepare": ("config",),
  "resolve": ("preset", "fields", "method_kwargs"),
  "main": ("argv",),
}
# What moved to fedjax_proj/training/ (training/pilot.py, training/continual_tasks.py).
TRAINERS = ("build", "run", "run_config", "run_method", "pretrain", "plot", "pilot_data")


@pytest.mark.parametrize("family", [*FAMILIES, "image"])
def test_family_exposes_the_protocol(family):
  module = importlib.import_module(f"fedjax_proj.configs.{family}")
  for name, args in PROTOCOL.items():
    fn = getattr(module, name, None)
    assert callable(fn), f"configs/{family}.py lacks {name}"
    # Binds exactly the protocol's arguments: no fewer (a missing parameter) and no required
    # extra one.
    inspect.signature(fn).bind(*args)
    with pytest.raises(TypeError):
      inspect.signature(fn).bind(*args, *([None] * 8))
  left = [n for n in TRAINERS if hasattr(module, n)]
  assert not left, f"configs/{family}.py still trains: {left} belong in fedjax_proj/training/"


@pytest.mark.parametrize("family", ["cifar10", "cifar100", "cinic10"])
def test_the_image_datasets_are_one_family(family):
  image = importlib.import_module("fedjax_proj.configs.image")
  module = importlib.import_module(f"fedjax_proj.configs.{family}")
  for preset in image.DATASETS[family]:
    assert module.get_config(preset).to_dict() == image.get_config(preset, family).to_dict()
  # Each dataset's entry point resolves its own dataset and refuses another's presets.
  assert module.resolve("smoke").dataset == family
  with pytest.raises(ValueError, match="Unknown preset 'nope'"):
    module.get_config("nope")


def test_every_image_entry_point_resolves_with_its_rules(tmp_path):
  from fedjax_proj.configs import cifar100, cinic10

  public = tmp_path / "imagenet100.npz"
  public.write_bytes(b"")
  c = cifar100.resolve("smoke", {"method": "feddf", "public_data": str(public)})
  assert c.method_kwargs.distill_epochs == 3  # the CIFAR-100 rule, not applied to CINIC-10
  c = cinic10.resolve("smoke", {"method": "feddf", "public_data": "cifar100"})
  assert "distill_epochs" not in c.method_kwargs
  with pytest.raises(ValueError, match="disjoint"):
    cifar100.resolve("smoke", {"method": "feddf", "public_data": "cifar100"})
  with pytest.raises(ValueError, match="sequential"):
    cinic10.resolve("smoke", {"method": "fedseq"})


def test_the_pilot_resolves_its_flags():
  from fedjax_proj.configs import pilot_iris

  c = pilot_iris.resolve("paper", {"rounds": 3, "methods": "fedavg,fedproj"})
  assert c.rounds == 3 and pilot_iris.method_list(c) == ["fedavg", "fedproj"]
  with pytest.raises(ValueError, match="more than once"):
    pilot_iris.resolve("paper", {"seeds": "1,1"})
  with pytest.raises(ValueError, match="no method_kwargs"):
    pilot_iris.resolve("paper", None, {"mu": 0.1})
