"""Training: the one loop every training kind runs, bi- and cross-encoder steps, the checkpoint
format, and the device, precision and seeding decisions."""
