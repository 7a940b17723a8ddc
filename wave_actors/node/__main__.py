"""`python -m wave_actors.node`: the node's command line."""
from wave_actors.node.cli import main

main()
