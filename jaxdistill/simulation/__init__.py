"""Simulating BSVS mechanisms over large client populations.

:func:`simulate` streams any :class:`~jaxdistill.mechanisms.BsvsMechanism`
over n clients in vmapped chunks under ``lax.scan`` (memory bounded in n),
sharded over a 1-D device mesh; the same key gives bitwise-identical output
for any chunk size and device count. :func:`build_mechanism` maps the CLI's
mechanism names to library classes. :func:`secret_key` gives a key from
secret OS randomness for a real release (a key from a recorded seed makes
the noise recomputable).
"""

from jaxdistill._keys import secret_key

from jaxdistill.simulation._memory import MeasuredRun
from jaxdistill.simulation._memory import measure_subprocess
from jaxdistill.simulation._memory import peak_rss_bytes
from jaxdistill.simulation._registry import MechanismSpec
from jaxdistill.simulation._registry import build_mechanism
from jaxdistill.simulation._registry import mechanism_names
from jaxdistill.simulation._registry import mechanism_spec
from jaxdistill.simulation._runner import ACCELERATOR_CHUNK_VALUES
from jaxdistill.simulation._runner import CLIENT_AXIS
from jaxdistill.simulation._runner import CPU_CHUNK_SIZE
from jaxdistill.simulation._runner import MAX_ACCELERATOR_CHUNK
from jaxdistill.simulation._runner import MAX_CLIENTS
from jaxdistill.simulation._runner import SimulationResult
from jaxdistill.simulation._runner import client_mesh
from jaxdistill.simulation._runner import client_statistics
from jaxdistill.simulation._runner import default_chunk_size
from jaxdistill.simulation._runner import simulate

__all__ = [
    "ACCELERATOR_CHUNK_VALUES", "CLIENT_AXIS", "CPU_CHUNK_SIZE", "MAX_ACCELERATOR_CHUNK", "MAX_CLIENTS",
    "MeasuredRun", "MechanismSpec", "SimulationResult", "build_mechanism", "client_mesh",
    "client_statistics", "default_chunk_size", "measure_subprocess", "mechanism_names", "mechanism_spec",
    "peak_rss_bytes", "secret_key", "simulate",
]
