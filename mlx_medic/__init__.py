"""mlx-medic: node knowledge shared by the exporter and the remediator."""

__version__ = "0.1.0"
