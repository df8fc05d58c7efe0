"""The database every process shares: engine, migrations, tables, the version lock and the paging cursor.

Below `service.serving` and `service.training`; knows no HTTP and nothing of either layer above it.
"""
