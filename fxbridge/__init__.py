"""torch.fx <-> problem bridge."""
