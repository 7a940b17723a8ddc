"""The fleet: calls placed over many nodes (one a GPU). `directory.py` holds which node has
each session and what each node has free; `placement.py` picks a node for a new call.
"""
