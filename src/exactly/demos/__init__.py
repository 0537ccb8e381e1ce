"""Self-contained demos and job entry points beyond the file demo (PostgreSQL, ...)."""
