"""The runtime: what runs jobs in a worker process.

``worker`` owns the others and wires them with narrow callbacks (no part holds
the worker): ``lane`` claims jobs of one handler and holds them, an executor
(``executor``: handler threads today) runs each ``attempt`` through
``execution``, the ``writer`` group-commits ``outcome``s and execution logs,
the ``heartbeat`` keeps held jobs alive and sees cancellations, the
``listener`` turns NOTIFY into claims, ``registry`` keeps the worker's row,
``health`` reports outages, ``supervisor`` runs several worker processes.
Builds on ``sql`` and the public models and handler; knows nothing of the
admin, the commands or maintenance (the worker runs the resetter it is given).
"""
