"""Money, as exact integers and ``Decimal``: amounts and their text (``units``), prices per GPU model
and share (``pricing``), credit rules (``credits``: the kinds of credit and when each is due),
idempotency keys of ledger entries (``keys``) and what a user lacks to start (``shortfall``).
Pure rules: no I/O (docs/architecture.md, rule 5)."""
