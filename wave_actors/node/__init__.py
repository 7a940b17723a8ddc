"""The node's front: one process per GPU that binds the ZeroMQ ROUTER, admits and routes
sessions (`node.py`), its command line (`cli.py`, `python -m wave_actors.node`), the bindings
that drive a session, the ZAP gatekeeper, flood limits and the demo calls.
"""
