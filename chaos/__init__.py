"""Chaos suite: a real node and its bridges under malformed input and a misbehaving network.

`python -m chaos.run` (run.py) starts the node and the bridges as subprocesses, streams a few
well-behaved *victim* sessions (some through `relay.Relay`, which resets, refuses and delays
their TCP connections), and meanwhile fuzzes every public surface: the node's ZMQ protocol
(zmq_fuzz.py), the Realtime WebSocket bridge (ws_fuzz.py) and, where present, the SIP bridge
(sip_fuzz.py, sending what sip_plan.py builds). It passes only when no process died, no victim lost its session to someone else's
traffic, and every input frame a victim sent is accounted for by the node's `closed` stats.
"""
