"""Pictures of token credit (HTML needs only torch; PNG needs the ``viz`` extra).

``credit_html``/``credit_png``/``group_credit``: one group from Python. ``report_html``
(and :mod:`ktae.viz.report_terminal`, :mod:`ktae.viz.report_png`): the pages of ``ktae
explain``, drawn from a :class:`ktae.viz.page.Report` that
:func:`ktae.explain.report.build_report` computes.
"""

from ktae.viz.credit import colour, credit_html, credit_png, group_credit
from ktae.viz.page import Report
from ktae.viz.report_html import report_html
from ktae.viz.tokens import token_pieces

__all__ = ["Report", "colour", "credit_html", "credit_png", "group_credit", "report_html",
           "token_pieces"]
