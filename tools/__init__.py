"""Developer tools of the warp_meshad checkout; not part of the installed package."""
