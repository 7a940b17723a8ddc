"""The beat clock (`clock.py`: one per GPU, packs each beat and runs it on the executor) and
the memory it shares with other processes: the frame ring, the beat's frame batch and its
output buffers over POSIX shared memory.
"""
