"""SIP/RTP bridge: phone calls in, node sessions out (`python -m transports.sip`).

    message   SIP parse/serialise/responses (RFC 3261 subset)
    sdp       SDP parse/serialise, G.711 offer/answer (RFC 4566, RFC 3264)
    media.rtp     RTP header pack/parse, sender state (RFC 3550)
    media.dtmf    RFC 4733 telephone events: payload parse, one report per key press
    media.jitter  adaptive jitter buffer for the caller's RTP
    media.pacer   playout buffer and drift-free 20 ms ticks for the node's audio
    call      one call's media: RTP socket, node session, tick/uplink/downlink tasks
    dialog    dialog state, in-dialog requests (BYE)
    transaction  retransmissions and timers (RFC 3261 §17)
    intake    a datagram's parse and checks (RFC 3261 §8.2 order), stateless answers
    offers    the INVITE's SDP offer checked, the codec negotiated, our answer
    refusals  refused calls: status, Retry-After, one log line each
    stats     the bridge's counters and event lines
    server    the UDP user agent server (`Bridge`)
    media.pcap    writes RTP captures (sipp's play_pcap_audio input, debugging)
"""
