"""The asyncio runtime under everything: actors and their mailboxes (`actors.py`), the turn
structure of a call, the event-loop stall and GC watches, metrics and CPU accounting.
"""
