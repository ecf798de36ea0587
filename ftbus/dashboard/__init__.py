"""The ftbus dashboard: a read-only web view of the pipeline (``ftbus dashboard``, ``ftbus up``).

- ``views``: pure functions from request records and consumer state to the JSON the pages draw;
- ``state``: the NATS side (its own connection, named ``dashboard``): watches the records, follows
  progress, polls the stage consumers and the dead-letter stream;
- ``app``: the Starlette application, its server-sent events, and ``serve()``.
"""
