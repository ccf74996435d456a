"""toolfleet's tests, by kind: unit/ (pure logic), integration/ (real Redis and processes),
chaos/ (fault injection, run with -m chaos); support/ holds their helpers and tool modules."""
