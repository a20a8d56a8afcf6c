"""The gpupool hub service: REST API, scheduled jobs and metrics."""
