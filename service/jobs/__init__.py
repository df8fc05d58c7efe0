"""Training jobs behind the API: SQL job records, a huey queue (SQLite or Redis) and worker processes."""
