"""`python -m sim.fast`: the fast mode's command line (`sim.fast.run.main`)."""
import sys

from sim.fast.run import main

if __name__ == "__main__":
    sys.exit(main())
