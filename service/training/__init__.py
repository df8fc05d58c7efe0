"""Training jobs behind the API: SQL job records (the jobs table is the queue) and worker processes."""
