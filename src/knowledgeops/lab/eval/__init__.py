"""`kops eval`: retrieval quality measured the way `kops bench` measures speed.

A collection is a folder of real documents and judged questions (collections.py); the service
under test is a fresh `kops serve` fed through its API (run.py); two baselines answer the same
questions from the same files (baselines.py); a hit is judged by how much of it lies in the
answering section, or how much of that section it holds (judge.py).
"""
