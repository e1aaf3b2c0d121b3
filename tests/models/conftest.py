"""Fixtures for the model tests."""

import pytest

from fedjax_proj.models import MODELS


@pytest.fixture(params=MODELS)
def model_name(request):
  return request.param
