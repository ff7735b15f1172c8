"""Data: rollouts, GAE, replay buffers, collectors and running statistics."""
