"""From the user's steps to stages: the steps, the chain of them, and a room per step family."""
