"""The ``dueflow`` command line."""
