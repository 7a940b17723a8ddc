"""OpenAI-Realtime-style WebSocket bridge to a wave node (issue 5): see `server.py`.

    python -m transports.realtime --node tcp://127.0.0.1:5555 --listen 127.0.0.1:8125

`session.py` parses the dialect's session config and formats, `conversation.py` maps the node's
duplex stream onto responses and items, `codec.py` converts audio, `outbox.py` bounds what a slow
client can make the bridge hold. README.md beside this file has the event mapping.
"""
