"""fedjax_proj: federated learning against global-knowledge forgetting, in JAX/Flax.

Clients are pure functions; all sampled clients of a round run as ``jax.vmap`` over a stacked
parameter pytree inside one ``jax.jit`` (or, on backends where that is slow, an execution strategy
with identical semantics; see :mod:`fedjax_proj.core.engine`).
"""

__version__ = "0.1.0"
