"""solve: see the modules."""
