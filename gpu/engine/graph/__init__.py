"""The graph executor's parts: its beats as CUDA graphs (`beat_graphs`), a beat's stages spread
over streams (`beat_streams`), a beat's launch and wait on the host (`beat_runner`), frame 0
routed while frame 1 computes (`first_frame`) and the pinned host rings (`host_rings`). The
`wpk` executor composes the same parts."""
