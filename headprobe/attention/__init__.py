"""The attention-row primitive: softmax rows of chosen query positions, every head, every layer."""
