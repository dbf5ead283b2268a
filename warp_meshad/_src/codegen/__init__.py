"""codegen: see the modules."""
