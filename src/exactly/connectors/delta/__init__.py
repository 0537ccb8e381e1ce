"""Delta Lake: the exactly-once ``exactly.delta`` sink (:mod:`exactly.connectors.delta.sink`)."""
