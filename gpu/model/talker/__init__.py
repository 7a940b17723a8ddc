"""The Gemma3-style talker that turns the thinker's text token into RVQ codes: its network
(`talker.py`), its shape (`config.py`), the MoG head (`mog.py`), its per-slot state (`state.py`), the text embedding
table and shared Gemma pieces (`text.py`) and weight loading (`weights.py`).
"""
