"""A fault-injection soak of the example shop (``make soak``; see docs/operations.md)."""
