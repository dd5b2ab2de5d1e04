"""Platform seams: what differs between Linux (tested for real) and macOS
(tested against verbatim outputs kept as fixtures)."""
