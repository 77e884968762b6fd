"""labrun: an autonomous research session as a durable Prefect flow."""

__version__ = "0.1.0"
