"""What the outbox tests run and start, kept out of the test files' way.

- ``helpers``: publishing from raw connections, counting effects, waiting,
  running the library's commands as subprocesses (:class:`helpers.Process`).
- ``rig``: a Redis or RabbitMQ of a test's own, a Celery worker subprocess.
- ``recorders``: the consumers the tests configure (an Order row per message).
- ``faulty_transports``: transports that die or stall mid-send, for crash tests.
- ``order_worker_app``: the end-to-end tests' Celery app (``celery -A ...``).
- ``fault_worker_app``: the fault tests' Celery app, a receiver built as the docs say.
- ``beat_worker_app``: the worker that also runs the library's scheduled tasks.
- ``tasks_receiver``: the receiver of the Django tasks tests.
- ``process_settings`` and its overlays (``fault_``, ``tasks_``,
  ``no_celery_process_settings``): the settings of the processes the tests start.
"""
