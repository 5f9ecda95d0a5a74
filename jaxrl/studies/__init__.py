"""The paper's studies as tools: chain-of-thought transfer, the lexical analysis of thinking, the reward analyses."""
