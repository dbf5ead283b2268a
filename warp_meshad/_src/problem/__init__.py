"""problem: see the modules."""
