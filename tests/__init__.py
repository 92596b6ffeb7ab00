"""The test suite; a package so that its files import their helpers as ``tests.helpers``."""
