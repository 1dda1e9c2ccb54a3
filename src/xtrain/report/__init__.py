"""The report stage (rules `report` and `compare`): the pages a person looks at, `reports/<recipe>/report.html`
and the cross-recipe `reports/compare.html` (`pages`)."""

from .pages import PLOTS, write_compare, write_report

__all__ = ["PLOTS", "write_compare", "write_report"]
