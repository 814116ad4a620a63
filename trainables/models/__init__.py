"""Models: loading encoders (by hub id, folder or packaged copy), truncation surgery, pooling heads,
token batching, and the training-step levers (dropout masks, the word-embedding gradient)."""
