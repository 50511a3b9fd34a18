"""The pure-torch core: advantage estimators, statistics, losses, calibration.

Nothing here imports a model, tokenizer or trainer.
"""
