"""Executors: local worker processes and a Dask cluster."""
