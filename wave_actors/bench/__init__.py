"""The capacity benchmark (`python -m wave_actors.bench`): its command line (`cli.py`), its
runs through the real node (`capacity.py`), its callers and the workloads they follow, deadline
metrics, the result schema that `sim` reads (`results.py`), and the provenance every result
records.
"""
