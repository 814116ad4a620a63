"""Training objectives: losses on pairs of sentence vectors (`pairs`) and the unsupervised
contrastive objectives SimCSE and miCSE (`contrastive`)."""
