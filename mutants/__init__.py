"""Mutation testing by catalogue: edits that break a documented claim (see run.py)."""
