"""The five-turn debugging agent (paper §5.1): environment, parser, episodes, multi-turn rollouts and token rows.

docs/agent.md describes the episode format, the parser's rules and the loss masking.
"""
