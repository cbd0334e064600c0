"""Imports every command module so that it registers on the app (one line each)."""
