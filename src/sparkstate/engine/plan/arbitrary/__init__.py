"""Planning arbitrary state: the user function or processor, its group state and initial state."""
