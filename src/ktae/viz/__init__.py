"""Pictures of token credit (HTML needs only torch; PNG needs the ``viz`` extra)."""

from ktae.viz.credit import colour, credit_html, credit_png, group_credit

__all__ = ["colour", "credit_html", "credit_png", "group_credit"]
