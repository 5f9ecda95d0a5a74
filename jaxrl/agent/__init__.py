"""The five-turn debugging agent (paper §5.1): environment, parser, episodes, multi-turn rollouts, token rows
and the trainer's agentic sample stage (`train.py`).

docs/agent.md describes the episode format, the parser's rules, the loss masking and agentic RL.
"""
