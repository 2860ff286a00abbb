"""Synthetic MicroBooNE-like single-particle events (physics -> charge -> pixels)."""

from lartpc.sim.generate import GENERATOR_VERSION, simulate_event, write_dataset

__all__ = ["GENERATOR_VERSION", "simulate_event", "write_dataset"]
