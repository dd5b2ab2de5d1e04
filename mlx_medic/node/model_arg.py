"""The MODEL argument of a node helper: an inventory model placed on this node.

One check for every helper (and the forced command, which parses with the helpers' own
parsers): a helper acts only on what the inventory places where it runs, and a name it
does not know is a bad command line (exit 2) that names it, never "nothing to do".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlx_medic.node.cli import BadArguments, NodeContext

if TYPE_CHECKING:
    from mlx_medic.inventory.model import Model


def placed_model(context: NodeContext, name: str, *, on_head: bool = False) -> Model:
    """The inventory's model `name` if it runs on this node (on its head with `on_head`),
    else BadArguments naming it."""
    if context.inventory is None:
        raise BadArguments(f"model {name!r}: pass --inventory FILE (it names the models)")
    try:
        model = context.inventory.model(name)
    except KeyError:
        known = ", ".join(m.name for m in context.inventory.models)
        raise BadArguments(f"model {name!r} is not in the inventory (models: {known})") from None
    if context.node not in model.nodes:
        raise BadArguments(
            f"model {name!r} is not placed on node {context.node}"
            f" (its nodes: {', '.join(model.nodes)})"
        )
    if on_head and context.node != model.head:
        raise BadArguments(
            f"model {name!r} keeps this on its head {model.head}, not on {context.node}"
        )
    return model
