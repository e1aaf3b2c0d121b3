"""Public labels reach FedProj's round-0 CE only when the public set is the private dataset."""

import numpy as np
import pytest

from fedjax_proj.training.config import base_config
from fedjax_proj.training.inputs import public_inputs, same_label_space


def _config(public_path):
  c = base_config()
  c.method = "fedproj"
  c.public_data = str(public_path)
  c.memory_size = 8
  return c


def _write(path, num_classes):
  rng = np.random.default_rng(0)
  image = rng.integers(0, 255, (16, 4, 4, 3), dtype=np.uint8)
  np.savez(path, image=image, label=np.arange(16) % num_classes, num_classes=num_classes)
  return image


def test_same_label_space_is_by_dataset_name_not_class_count():
  assert same_label_space("cifar10", "cifar10")
  assert same_label_space("CIFAR-100", "cifar100")
  assert not same_label_space("imagenet100", "cifar100")  # both 100 classes
  assert not same_label_space("", "cifar10")


def test_public_labels_only_for_the_private_datasets_label_space(tmp_path):
  train_x = np.zeros((4, 4, 4, 3), np.uint8)
  # 100 classes like CIFAR-100, but another dataset (e.g. ImageNet-100): no labels.
  other = tmp_path / "imagenet100.npz"
  _write(other, 100)
  inputs, size = public_inputs(_config(other), train_x, 100, "cifar100")
  assert size == 16 and "public_labels" not in inputs
  # The private dataset itself (a held-out part of CIFAR-100): labels are passed.
  same = tmp_path / "cifar100.npz"
  _write(same, 100)
  inputs, _ = public_inputs(_config(same), train_x, 100, "cifar100")
  np.testing.assert_array_equal(inputs["public_labels"], np.arange(16) % 100)


def test_code_normalization_uses_the_codes_stds_and_the_public_sets_own_statistics(tmp_path):
  from fedjax_proj.data import pipeline
  from fedjax_proj.training.config import validate_config
  from fedjax_proj.training.inputs import public_normalizer

  x = np.full((1, 1, 1, 3), 255, np.uint8)
  mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
  np.testing.assert_allclose(
    np.asarray(pipeline.normalizer_for("cifar10", x, "code")(x))[0, 0, 0],
    (1 - np.array(mean)) / np.array(std),
    rtol=1e-6,
  )
  assert not np.allclose(  # the dataset's own pixel std differs
    pipeline.normalizer_for("cifar10", x)(x), pipeline.normalizer_for("cifar10", x, "code")(x)
  )
  c = _config(tmp_path / "cifar100" / "public_20k.npz")
  assert public_normalizer(c, x) is None  # --normalization=dataset: the private normaliser
  c.normalization = "code"
  np.testing.assert_allclose(  # named by the folder holding the file: CIFAR-100's code values
    np.asarray(public_normalizer(c, x)(x))[0, 0, 0],
    (1 - np.array([0.507, 0.487, 0.441])) / np.array([0.267, 0.256, 0.276]),
    rtol=1e-6,
  )
  other = _config(tmp_path / "mine.npz")
  other.normalization = "code"
  images = np.random.default_rng(0).integers(0, 255, (64, 2, 2, 3), dtype=np.uint8)
  out = np.asarray(public_normalizer(other, images)(images), np.float64)  # its own statistics
  np.testing.assert_allclose(out.reshape(-1, 3).mean(0), 0.0, atol=1e-5)
  c.normalization = "imagenet"
  with pytest.raises(ValueError, match="normalization"):
    validate_config(c)


def test_a_method_without_a_public_set_never_loads_the_presets_one():
  def load(*args, **kwargs):
    raise AssertionError("loaded a public set the method never reads")

  c = _config("sentiment140")  # an NLP preset's TFDS set, absent offline
  for method in ("fedavg", "fedgkd", "moon"):
    c.method = method
    assert public_inputs(c, np.zeros((4, 2, 8), np.int32), 2, "sst2", load=load) == ({}, 0)
  c.method = "feddf"
  with pytest.raises(AssertionError, match="loaded a public set"):
    public_inputs(c, np.zeros((4, 2, 8), np.int32), 2, "sst2", load=load)
