"""The data-access layer: the one place that turns intent into SQL (internal, not part of the public API).

- ``statements``: the statements and their parameter builders, pure (``Statements(settings).<name>(...) -> Call``).
- ``run``: one way to run a ``Call``, sync and async (a pool connection in autocommit, or the caller's ``conn=``).
- ``validation``, ``encoding``, ``copy``: enqueue options checked, payloads encoded, ``enqueue_many`` by COPY.
- ``worker``: the async-only ``WorkerStore`` protocol the worker talks to, and its PostgreSQL implementation
  (retries over dead pooled connections, error accounting, replans).
- ``admin``: what the CLI, the scheduler, both retentions and the operator need (one purge, under one lock).

The migrator (``skiplock.migrate``) and the doctor (``skiplock.doctor``) keep their own SQL; nothing else runs SQL.
"""
