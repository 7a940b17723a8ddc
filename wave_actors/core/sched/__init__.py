"""Who runs when, torch-free: the session table (slots and generations) with each session's
jitter buffer (`jitter` as rules, `jitter_arrays` as array operations), the slot book (the
model-side phases of every slot and the beat's plan), the start and clock policies, the start
queue, snapshots of shared prompts and the spread of rolls."""
