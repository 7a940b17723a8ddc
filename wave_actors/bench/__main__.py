"""`python -m wave_actors.bench`: the capacity benchmark."""
import sys

from wave_actors.bench.cli import main

try:
    sys.exit(main())
except (MemoryError, RuntimeError, ValueError) as exc:
    sys.exit(f"bench: {exc}")
