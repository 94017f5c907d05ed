"""kvtier's guardrail: the rollback rule evaluated live in the collector
(:mod:`kvtier.guardrail.watch`), what it exports (``metrics``), the operator's page and
command (``operator``, ``client``)."""
