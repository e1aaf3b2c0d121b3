"""Settings for the whole test suite."""

from __future__ import annotations

import os

from fedjax_proj.training import compilation_cache

# The entry points turn JAX's persistent compilation cache on by default, in the user's cache
# folder. The suite runs them in process and as subprocesses (which inherit this environment); it
# must not write there, so its default is off. Tests of the cache pass their own folder.
os.environ[compilation_cache.ENV] = compilation_cache.OFF
