"""The front's client connections below HTTP: their caps and deadlines (``guarded.py``, counted by
``count.py``), the lean per-connection objects that replace uvicorn's (``lean.py``), and the
hand-over of a connection to the app for an event stream or a large answer (``handover.py``)."""
