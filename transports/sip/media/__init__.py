"""The SIP bridge's media path: RTP packets, the jitter buffer, pacing, source latching, DTMF
(RFC 4733) and packet capture."""
