"""Drivers and checks that measure the serving tree from outside it: an executor driven beat by
beat as the clock drives it (`beat_driver`), parity against the eager model (`parity`),
teacher-forced fidelity (`fidelity`, `fidelity_forcing`), and the wpk synchronisation probes
with their sm_90 compile check (`wpk_probes`, `wpk_compile_check`). Tests and the device
scripts under `bench/` use them; nothing that serves a call imports them."""
