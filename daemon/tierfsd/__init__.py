"""The tierfs daemon process (the only package that imports pyfuse3)."""
