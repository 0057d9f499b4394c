"""Simulating BSVS mechanisms over large client populations."""

from jaxdistill.simulation._runner import SimulationResult
from jaxdistill.simulation._runner import client_statistics
from jaxdistill.simulation._runner import simulate

__all__ = ["SimulationResult", "client_statistics", "simulate"]
