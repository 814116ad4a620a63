"""What each training kind is made of (models, one round, evaluation), imported only in trials:
the kinds in `trainables.kinds` declare; these run."""
