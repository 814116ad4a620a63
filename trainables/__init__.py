"""Trial-side code: data, models, objectives, evaluators, the one training loop and the trainable
kinds (`trainables.kinds`, a closed registry of YAML names)."""
