"""mesh: see the modules."""
