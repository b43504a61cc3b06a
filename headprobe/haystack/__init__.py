"""Haystacks: corpus text, needle sets, task prompts, and building trial contexts from them."""
