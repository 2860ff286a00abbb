"""Event storage and loading."""

from lartpc.data.store import Event, EventStore, EventStoreError, write_shard

__all__ = ["Event", "EventStore", "EventStoreError", "write_shard"]
