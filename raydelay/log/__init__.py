"""The partition log (pure: no Ray): entry formats and the group-committing log."""
