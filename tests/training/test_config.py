"""training.config: the --method_kwargs a method accepts come from its factory's signature."""

from __future__ import annotations

import pytest

from fedjax_proj.training.config import method_hparams, validate_method_kwargs


def test_method_hparams_come_from_the_factories():
  assert method_hparams("fedprox") == {"mu": 0.01}
  assert method_hparams("fedavg") == {} == method_hparams("fedseq")
  assert method_hparams("sfedkd")["num_teachers"] == 5
  fedproj = method_hparams("fedproj")
  assert fedproj["memory_batch_size"] == 256 and "public_size" not in fedproj
  validate_method_kwargs("fedproj", {"tau": 1, "max_coef": 0.5})  # int for float: ok
  with pytest.raises(ValueError, match="takes a int"):
    validate_method_kwargs("fedgkd", {"buffer_size": 2.5})
