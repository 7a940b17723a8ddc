"""The torch-free contract every part of wave imports: frame and beat constants, the executor
contract, the session table and slot book, text codecs and prompts, function-call parsing, the
jitter scheduler and the scheduling policies. It imports nothing of gpu/, sim/ or transports/
(tests/runtime/test_imports.py checks it)."""
