"""The front's side of the worker processes: the pool of calls (:mod:`.pool`), each account's
workers (:mod:`.accounts`), one worker's socket and frames (:mod:`.channel`) and how workers are
started (:mod:`.spawner`)."""
