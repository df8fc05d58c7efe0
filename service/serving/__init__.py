"""Serving: the registry and its follower, model versions on disk, active versions, batching, retrieval
and the predictor. Below `service.training` (which publishes into it) and `service.api`; knows no HTTP."""
