"""Sessions: the actor per live call (`session.py`), and the worker processes that host them
when the node runs with `--workers` (the pool, the worker, their wire format).
"""
