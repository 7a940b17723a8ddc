"""The fast mode: the node's scheduling replayed beat by beat on arrays, without actors, for long
runs and searches (`sim.fast.fast`; its configuration, drivers, results and command line beside
it)."""
