"""The run: finalize, train, resume, and what the terminal shows meanwhile."""
