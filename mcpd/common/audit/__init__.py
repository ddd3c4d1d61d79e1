"""The audit log as its writers write it: one JSON line per call, decision, login, worker, reload
or alert, hash-chained (docs/REFERENCE.md §7).

Used by the policy process (the audit log) and the front (the access log); ``mcpd audit``
(:mod:`mcpd.admin.audit`) reads back with the same chain rules. Root never loads it.

- :mod:`~mcpd.common.audit.records`: the field rules and a record's canonical encoding;
- :mod:`~mcpd.common.audit.chain`: the hash chain both sides share (hash, ``seq``, file numbers);
- :mod:`~mcpd.common.audit.head`: the chain's head file, outside the log;
- :mod:`~mcpd.common.audit.alerts`: the rate limit on alerts;
- :mod:`~mcpd.common.audit.journal`: the journal copy;
- :mod:`~mcpd.common.audit.checkpoint`: checkpoints of the chain, to the journal and syslog;
- :mod:`~mcpd.common.audit.writer`: :class:`~mcpd.common.audit.writer.AuditLog`, with its checks
  on start and before each record.
"""
