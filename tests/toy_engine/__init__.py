"""A made-up engine outside the package, added as an installed plug-in (tests/service/test_engine_plugin.py):
proof that an engine is one folder and one registry line, and nothing in the core names it."""
