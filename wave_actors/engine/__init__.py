"""The engine's process: the executor and the beat clock in a process of their own
(`process.py`), the front's side of it (`host.py`) and the process settings both use.
"""
