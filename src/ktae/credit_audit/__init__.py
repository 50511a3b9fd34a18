"""The credit audit (``ktae audit``): token credit measured against local-error labels."""

from ktae.core.credit_metrics import response_metrics, summarise
from ktae.credit_audit.run import AuditGroup, audit, audit_groups, default_methods

__all__ = ["AuditGroup", "audit", "audit_groups", "default_methods", "response_metrics",
           "summarise"]
