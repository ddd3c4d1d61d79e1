"""``mcpd audit``: reading the audit and access logs back (docs/REFERENCE.md §7).

The daemon writes the logs (:mod:`mcpd.common.audit`); nothing here runs inside it.

- :mod:`~mcpd.admin.audit.logfiles`: a log's lines and its rotated files, forwards and backwards;
- :mod:`~mcpd.admin.audit.verify`: every break of the hash chain;
- :mod:`~mcpd.admin.audit.checkpoints`: checkpoints a collector kept, against the log;
- :mod:`~mcpd.admin.audit.retention`: the files logrotate's retention removed on purpose;
- :mod:`~mcpd.admin.audit.filters`: which records a view shows, and their order;
- :mod:`~mcpd.admin.audit.loads`: the grants file of each load, rebuilt;
- :mod:`~mcpd.admin.audit.views`: one readable line per record;
- :mod:`~mcpd.admin.audit.commands`: the click commands (``tail``, ``verify``, ``replay``,
  ``grants at``).
"""
