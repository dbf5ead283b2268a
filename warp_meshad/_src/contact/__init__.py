"""contact: see the modules."""
