"""Per-node Prometheus exporter: read-only views of MLX rank hygiene."""
