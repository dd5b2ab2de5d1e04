"""mlx-medic: node knowledge shared by the exporter and the remediator.

The map (docs/architecture.md tells more):

    inventory/   the inventory file: its schema, loading, and the snapshot node helpers read
    processes/   what an MLX process is and whose: roles, scope, placement, orphans, survivors
    state/       the files a node keeps: layout, run records, ledger, locks, backend choice
    node/        the node helpers (`mlx-medic node ...`) and how a caller runs them
    serve/       the serve wrapper (`mlx-medic serve MODEL`)
    platform/    operating-system seams;  transport/  how a caller acts on a node
    render/      `mlx-medic render`;  doctor/  `mlx-medic doctor`, a node's setup checked
    exporter/, remediator/  the two deployables
    *.py         the rest they share: health probe, model lock, signatures, tmp rules, CLI
"""

__version__ = "0.1.0"
