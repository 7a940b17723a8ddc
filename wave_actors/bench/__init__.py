"""The capacity benchmark (`capacity.py`, `python -m wave_actors.bench`): its callers, the
workloads they follow, deadline metrics, the result schema that `sim` reads, and the
provenance every result records.
"""
