"""The example shop of django-idempotency-outbox (``make demo``)."""
