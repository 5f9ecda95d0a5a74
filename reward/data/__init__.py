"""Debugging task sets: bug operators, program sources, and the verified PDB-style build."""
