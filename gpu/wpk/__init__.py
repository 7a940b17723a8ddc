"""The wave persistent kernel: `sync` (acquire/release waits and signals, a grid barrier, the
GPU clock), `mailbox` (the clock's doorbell, descriptor ring and completion words, and the
resident controller program), `controller` (the host's handle: pauses, the watchdog),
`beat_kernels` (the gate, the frames read on the device, frames done), `testing` (grids on
threads under the interpreter), `compile_check` (sm_90 code and registers on a CPU) and
`probes` (small kernels of the sync primitives). `gpu/engine/wpk_executor.py` serves with them
(`--backend wpk`, off by default); docs/WPK.md describes it."""
