"""Who a name or a caller is: the hub names the pool accepts (``names``), the Unix account a name runs
as and which accounts never run a server (``unix``), and the secrets that prove a caller (``secretfile``:
a secret read from a file; ``spawner_token``: the spawner's token for the service)."""
