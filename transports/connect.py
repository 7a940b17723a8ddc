"""A bridge's way to the model: one node, or a fleet of them."""
from __future__ import annotations

from transports.client import CurveKeys, NodeClient


def connect_to(node: str, fleet: str | None = None, curve: CurveKeys | None = None):
    """One node's client, or with `fleet` (a Ray address, e.g. `auto`) a `FleetClient` that
    places each call on a node of the fleet."""
    if fleet:
        from transports.fleet_client import FleetClient    # Ray is needed only for a fleet
        return FleetClient.join(fleet, curve)
    return NodeClient(node, curve=curve)
