"""The inventory: one YAML file that describes the cluster, validated, loaded and
kept as plain data.

    schema          the whole file (`Inventory`) and its nodes, ssh and signatures sections
    model           a served model's section (`models.<name>`: service, backends, processes)
    model_settings  a model's `policy` and `serve`
    fields          the field types every section shares (names, durations, paths)
    load            loading, each error with its line (`load_inventory`, `parse_inventory`)
    methods         what the inventory's objects answer beyond their fields (no pydantic)
    snapshot        the validated inventory as plain data, which node helpers read
    reference       the field table of docs/inventory.md
    names           the one rule for the names the inventory gives

Imports nothing: a node helper imports `mlx_medic.inventory.snapshot` without pydantic,
so import each thing from the module that defines it.
"""
