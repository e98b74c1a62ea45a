"""Operator controls kept in the database: pausing handlers and task queues, periodic
schedules, unique jobs, and the audit trail of what operators changed."""
