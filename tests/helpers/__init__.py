"""Helpers shared by the test modules (no tests here): test modules import these, never each
other."""
