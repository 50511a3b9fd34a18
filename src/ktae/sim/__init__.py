"""``ktae simulate``: the TACO paper's synthetic MDP, every credit method against the oracle."""
