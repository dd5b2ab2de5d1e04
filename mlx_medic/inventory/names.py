"""The one rule for names the inventory gives (nodes, models, signatures).

Apart from the inventory's schema so that code checking a name (the log signatures, read
by an exporter without an inventory too) does not load pydantic.
"""

# Names become metric label values and lock/state file names: keep them tame.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
