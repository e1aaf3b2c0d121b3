"""training.config: --method_kwargs are checked against the method's declared hyperparameters."""

from __future__ import annotations

import pytest

from fedjax_proj.training.config import validate_method_kwargs


def test_method_kwargs_are_checked_against_the_declared_hyperparameters():
  validate_method_kwargs("fedproj", {"tau": 1, "max_coef": 0.5})  # int for float: ok
  with pytest.raises(ValueError, match="--method_kwargs: buffer_size=2.5 .* takes a int"):
    validate_method_kwargs("fedgkd", {"buffer_size": 2.5})
  with pytest.raises(ValueError, match="--method_kwargs: unknown key.s. nu for --method=fedprox"):
    validate_method_kwargs("fedprox", {"nu": 1.0})
