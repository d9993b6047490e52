"""What a stream did: its timeline and the figures drawn from it."""
