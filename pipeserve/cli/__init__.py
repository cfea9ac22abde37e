"""The ``pipeserve`` command."""
