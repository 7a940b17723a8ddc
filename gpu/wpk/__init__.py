"""The wave persistent kernel (issue 18; design and measurements: ../shared/WPK.md,
docs/WPK.md). Built so far: `sync` (acquire/release waits and signals, grid barrier, GPU clock),
`mailbox` (the clock's doorbell, descriptor ring and completion words, and a resident
controller program), `controller` (the host's handle: pauses, watchdog), `schedule` (task tables and their validator), `taskrun` (a program that walks them), `testing` (grids on
threads under the interpreter), `compile_check` (sm_90 code and registers on a CPU), `probes`.
No executor uses them yet: `--backend wpk` does not exist."""
