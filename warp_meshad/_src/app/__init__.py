"""app: see the modules."""
