"""The data-access layer: the one place that turns intent into SQL (internal, not part of the public API).

- ``statements``: the statements and their parameter builders, pure (``Statements(settings).<name>(...) -> Call``).
- ``run``: one way to run a ``Call``, sync and async (a pool connection in autocommit, or the caller's ``conn=``).
- ``validation``, ``copy``: enqueue options checked, payloads encoded, ``enqueue_many`` by COPY.
- ``worker``: the async-only ``WorkerStore`` protocol the worker talks to, and its PostgreSQL implementation
  (retries over dead pooled connections, error accounting, replans).
- ``purge``: the one purge (the workers' retention, the operator's, ``skiplock purge``), under one lock;
  ``schedules``: the schedules table; ``ui``: the web UI's reads and actions.

The migrator (``skiplock.migrate``) and the doctor (``skiplock.doctor``) keep their own SQL; nothing else runs SQL.
"""
