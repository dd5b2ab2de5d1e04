"""The files mlx-medic keeps on a node, in its state dir (docs/state-layout.md).

    layout           who owns the dir and each part of it, with which mode
    files            records written whole and read without following a link
    runs             the current run of each model, and run ids
    ledger           the protection-domain ledger
    model_lock_file  the model lock's file on the head
    backend_choice   the model's durable backend choice
    service_stop     "run X stopped the model's service"
    node_identity    which inventory node this is (the node-id file)

Imports nothing, and no module here loads pydantic: node helpers read these.
"""
