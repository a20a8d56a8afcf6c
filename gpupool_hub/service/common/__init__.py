"""What the service's API handlers, pages and jobs share, below all three: the hub's REST client
(``hubapi``), the service's metrics (``metrics``) and the context each handler is given (``context``).
``service/app.py`` and ``webapp.py`` build them; nothing here imports back up."""
