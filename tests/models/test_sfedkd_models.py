"""SFedKD's networks (papers/004, Sect. 4.1): parameter counts and shapes from the layer arithmetic.

The paper names the networks ("an 8-layer AlexNet [24]", "a LeNet-5 [26]") but states neither
layers nor parameter counts, so the expected counts below are summed layer by layer from the
definitions in fedjax_proj/models/alexnet8.py and lenet.py (docs/sfedkd.md, "Networks").
"""

import jax
import jax.numpy as jnp
import pytest

from fedjax_proj.models import count_params, get_model


def _conv(k, cin, cout):
  return k * k * cin * cout + cout


def _dense(din, dout):
  return din * dout + dout


def _shapes(name, input_shape, num_classes=10):
  model = get_model(name, num_classes)
  x = jnp.zeros((2, *input_shape), jnp.float32)
  variables = jax.eval_shape(model.init, jax.random.key(0), x)
  out = jax.eval_shape(lambda v: model.apply(v, x, train=False), variables)
  return variables, out


def test_lenet5_layers_and_count():
  # 28 -conv5-> 24 -pool-> 12 -conv5-> 8 -pool-> 4: 16 * 4 * 4 = 256 inputs to the first fc.
  expected = _conv(5, 1, 6) + _conv(5, 6, 16) + _dense(256, 120) + _dense(120, 84) + _dense(84, 10)
  assert expected == 44_426
  variables, out = _shapes("lenet5", (28, 28, 1))
  assert count_params(variables) == expected
  assert out.logits.shape == (2, 10) and out.features.shape == (2, 84)
  assert variables.keys() == {"params"}  # no batch-dependent state along the sequential chain


def test_alexnet8_has_five_convs_three_fc_and_count():
  # 32 -conv/2-> 16 -pool-> 8 -conv-> 8 -pool-> 4 -conv,conv,conv-> 4 -pool-> 2: 256 * 2 * 2 = 1024.
  convs = _conv(3, 3, 64) + _conv(3, 64, 192) + _conv(3, 192, 384) + _conv(3, 384, 256)
  convs += _conv(3, 256, 256)
  fcs = _dense(1024, 4096) + _dense(4096, 4096) + _dense(4096, 10)
  assert convs + fcs == 23_272_266
  variables, out = _shapes("alexnet8", (32, 32, 3))
  assert count_params(variables) == convs + fcs
  params = variables["params"]
  assert sorted(k for k in params if k.startswith("conv")) == [f"conv_{i}" for i in range(5)]
  assert sorted(k for k in params if k.startswith(("fc", "head"))) == ["fc_0", "fc_1", "head"]
  assert out.logits.shape == (2, 10) and out.features.shape == (2, 4096)
  assert variables.keys() == {"params"}


@pytest.mark.parametrize("name,shape", [("lenet5", (28, 28, 1)), ("alexnet8", (32, 32, 3))])
def test_head_width_follows_num_classes(name, shape):
  variables, out = _shapes(name, shape, num_classes=100)
  assert out.logits.shape == (2, 100)
  assert variables["params"]["head"]["kernel"].shape[-1] == 100
