"""Pictures of token credit (HTML needs only torch; PNG needs the ``viz`` extra).

``credit_html``/``credit_png``/``group_credit``: one group from Python. ``build_report`` +
``report_html`` (and :mod:`ktae.viz.report_terminal`, :mod:`ktae.viz.report_png`): the
pages of ``ktae explain``, several groups with their views and statistics.
"""

from ktae.viz.credit import colour, credit_html, credit_png, group_credit
from ktae.viz.report import GroupInput, Report, build_report
from ktae.viz.report_html import report_html
from ktae.viz.tokens import token_pieces

__all__ = ["GroupInput", "Report", "build_report", "colour", "credit_html", "credit_png",
           "group_credit", "report_html", "token_pieces"]
