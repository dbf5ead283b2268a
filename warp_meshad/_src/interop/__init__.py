"""interop: see the modules."""
