"""``--model_kwargs``: the model's options from the command line, over the preset's, checked before
any data is read; the convolution implementation it names, or else the placement's choice (its
fallback where oneDNN's handler is unavailable), is what the run's model is built with and what its
log line says (docs/performance.md, "The CPU convolution kernel gradient")."""

from __future__ import annotations

import importlib.metadata

import pytest

from fedjax_proj.configs import cifar10, common
from fedjax_proj.models import CONV_IMPLS, onednn
from fedjax_proj.training import experiment


def _config(argv):
  """cifar10.py's config for ``argv`` (its flags, then its preset rules), as ``main`` runs it."""
  c = common.parse_config(argv, "cifar10", cifar10.get_config, {}, presets=cifar10.PRESETS)
  return cifar10.prepare(c)


def _error(capsys, argv) -> str:
  with pytest.raises(SystemExit) as e:
    _config(argv)
  assert e.value.code == 2
  return capsys.readouterr().err


def test_model_kwargs_go_over_the_presets_options():
  c = _config(["--preset=fedgkd_paper", "--model_kwargs=conv_impl=gemm_grad,group_size=8"])
  # The preset's norm stays, its group_size is replaced, conv_impl is added.
  assert dict(c.model_kwargs) == {"norm": "group", "group_size": 8, "conv_impl": "gemm_grad"}
  assert "model_kwargs" not in _config(["--preset=smoke"])  # no flag: the preset's (none)
  for impl in CONV_IMPLS:
    assert dict(_config([f"--model_kwargs=conv_impl={impl}"]).model_kwargs) == {"conv_impl": impl}


@pytest.mark.parametrize(
  "flags,named",
  [
    (["--model_kwargs=conv_impl=fast"], "conv_impl='fast' is not a convolution implementation"),
    (["--model=mlp", "--model_kwargs=conv_impl=xla"], "--model=mlp has no convolution"),
    (["--model=cnn", "--model_kwargs=width=3"], "--model=cnn does not take these options"),
    (["--model=resnet10", "--model_kwargs=width=3"], "--model=resnet10 does not take these"),
    (["--model_kwargs=conv_impl"], "--model_kwargs expects key=value pairs"),
    (["--model_kwargs=conv_impl=xla,conv_impl=onednn"], "--model_kwargs gives conv_impl twice"),
  ],
)
def test_bad_model_kwargs_exit_2_naming_the_fix(capsys, flags, named):
  assert named in _error(capsys, ["--preset=smoke", *flags])


def _built_with(c, monkeypatch) -> tuple[list[str], dict]:
  """Runs ``c`` up to its model's construction: (the run's log lines, the model's options)."""
  built = {}

  class Built(Exception):
    pass

  def get_model(name, num_classes, **kwargs):
    built.update(kwargs)
    raise Built  # nothing is compiled: the choice is made and logged before this

  monkeypatch.setattr(experiment, "get_model", get_model)
  logs: list[str] = []
  with pytest.raises(Built):
    experiment.run_experiment(c, log=logs.append)
  return logs, built


def _digits(tmp_path, *flags):
  return _config(
    ["--preset=smoke", "--dataset=digits", "--model=cnn", f"--output_dir={tmp_path}", *flags]
  )


def test_the_flags_conv_impl_builds_the_model_and_is_logged(tmp_path, monkeypatch):
  logs, built = _built_with(_digits(tmp_path, "--model_kwargs=conv_impl=xla"), monkeypatch)
  assert built["conv_impl"] == "xla"
  assert "convolutions: conv_impl=xla (--model_kwargs)" in logs


def test_without_onednn_the_run_falls_back_to_gemm_grad_and_logs_why(tmp_path, monkeypatch):
  """oneDNN's wheels hidden (their distribution lookup fails): the run's CNN is built with
  gemm_grad and the log line names the missing wheel and the fix."""
  real = importlib.metadata.distribution

  def distribution(name):
    if name == onednn.LIBRARY_DIST:
      raise importlib.metadata.PackageNotFoundError(name)
    return real(name)

  monkeypatch.setattr(importlib.metadata, "distribution", distribution)
  onednn.unavailable_reason.cache_clear()
  try:
    logs, built = _built_with(_digits(tmp_path), monkeypatch)
  finally:
    onednn.unavailable_reason.cache_clear()
  assert built["conv_impl"] == "gemm_grad"
  line = (
    "convolutions: conv_impl=gemm_grad (oneDNN convolutions unavailable: onednn-cpu-gomp is not "
    f"installed ({onednn.install_hint()}); the convolutions are XLA's with gemm_grad's kernel "
    "gradient)"
  )
  assert line in logs, logs


def test_another_model_leaves_the_presets_model_options_out_and_says_so(capsys):
  # fedgkd_paper's norm=group,group_size=16 are resnet8's; --model=cnn raised a TypeError from
  # the cnn factory after the data was read.
  c = _config(["--preset=fedgkd_paper", "--model=cnn"])
  assert c.model == "cnn" and dict(c.model_kwargs) == {}
  err = capsys.readouterr().err
  assert "--model=cnn replaces the preset's resnet8" in err and "group_size=16,norm=group" in err
  from fedjax_proj.models import get_model

  get_model(c.model, 10, **dict(c.model_kwargs))  # builds: no option it does not take
  # Options given for the new model go on it; the same model keeps the preset's options.
  c = _config(["--preset=fedgkd_paper", "--model=cnn", "--model_kwargs=conv_impl=gemm_grad"])
  assert dict(c.model_kwargs) == {"conv_impl": "gemm_grad"}
  c = _config(["--preset=fedgkd_paper", "--model=resnet8"])
  assert dict(c.model_kwargs) == {"norm": "group", "group_size": 16}
  # A network that takes the preset's options keeps them (resnet10 has the same norm options).
  capsys.readouterr()
  c = _config(["--preset=fedgkd_paper", "--model=resnet10"])
  assert dict(c.model_kwargs) == {"norm": "group", "group_size": 16}
  assert "left out" not in capsys.readouterr().err
