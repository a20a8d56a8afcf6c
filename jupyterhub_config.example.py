# jupyterhub_config.example.py — a JupyterHub with a gpupool: token balances,
# priced GPU profiles, packed placement and usage debits.
#
# The hub and the gpupool service both read the hub's configuration file: the
# hub for its own settings and the spawner, the service (started below as a
# managed service) for c.GPUPool and c.GPUPoolService. Copy this file to
# jupyterhub_config.py and adapt the marked parts, or load it from yours with
# load_subconfig("jupyterhub_config.example.py") and override after it: the
# service reads your file either way.
#
# Safe to copy: every user's server runs as that user's own Unix account, so
# code in one user's server cannot read another user's files, the service's
# token or the ledger. That needs a Unix account per hub user and the hub
# running as root (or the sudospawner route: docs/admin-guide.md, "User
# isolation"). `scripts/demo.sh` runs this file with a simulated pool (no GPU
# needed) and demo-only shortcuts in its own generated config (one Unix user
# for everybody, any password): never copy those.

import os
import secrets
import sys

from gpupool_hub.hub_templates import TEMPLATE_PATH
from gpupool_hub.service.configfile import hub_config_file

c = get_config()  # noqa: F821  (provided by JupyterHub's config loader)

# The hub's own configuration file (its -f), so the service reads the same
# settings, including whatever a file that load_subconfig()s this one sets
# after it. GPUPOOL_CONFIG_FILE overrides it (e.g. a file just for the service).
CONFIG_FILE = hub_config_file(fallback=__file__)

# The service's own hub API token, known to the hub and the service only (the
# spawner has a secret of its own, below). Random per start is fine, since the
# hub restarts its managed services with it; GPUPOOL_API_TOKEN fixes it.
GPUPOOL_API_TOKEN = os.environ.get("GPUPOOL_API_TOKEN") or secrets.token_hex(32)

# ----------------------------------------------------------------- the hub
c.JupyterHub.bind_url = "http://127.0.0.1:8000"         # where users connect (CHANGE in production)
c.JupyterHub.authenticator_class = "pam"                 # the machine's Unix accounts and their passwords
c.Authenticator.allowed_users = {"alice", "bob"}         # who may log in (CHANGE; or c.PAMAuthenticator.allowed_groups)
c.Authenticator.admin_users = {"admin"}                  # hub admins (also gpupool admins, see roles)

# Spawners that ask the gpupool before starting a server. "gpupool-localprocess"
# runs each server as its user's Unix account (the hub runs as root), with a
# umask of 077 so files users create are private. Others: "gpupool-systemd"
# (one systemd unit per server, also per-user), "gpupool-kubernetes" (see the
# Kubernetes section at the end). Never "gpupool-simple" outside a demo: it runs
# every user's server as the hub's own user, where any user's code can read
# the gpupool service's API token and every other user's files.
# GPUs: "gpupool-localprocess" hides other GPUs only by environment variables,
# which users' code can change; run the node agent (gpupool-agent) on every GPU
# node, which stops GPU processes of users holding no allocation there, or use
# "gpupool-systemd", whose units may open only their own GPUs' device nodes.
c.JupyterHub.spawner_class = "gpupool-localprocess"
c.Spawner.default_url = "/lab"                           # open JupyterLab, where the balance widget lives
c.JupyterHub.allow_named_servers = True                  # each named server holds its own GPUs
# At most 5 named servers per user (stopped ones count until deleted); without a
# limit one user can create hundreds. Waiting for GPUs is capped separately
# (c.GPUPool.max_waiting_per_user, 2 by default).
c.JupyterHub.named_server_limit_per_user = 5
c.JupyterHub.cleanup_servers = False                     # a hub restart keeps servers and their GPUs
# configurable-http-proxy that the kernel stops when the hub exits, however it exits: JupyterHub
# leaves its proxy running when a managed service fails at start (the gpupool service refusing a
# bad setting or an old ledger). Drop this line if you set c.JupyterHub.cleanup_proxy = False.
c.ConfigurableHTTPProxy.command = ["gpupool-proxy"]
# The hub's home and spawn-progress pages with the wait queue: a waiting server's place and
# range, "Leave the queue", a browser notification when it is ready (templates that extend
# JupyterHub's own; put your own folder first to change them: docs/spawner.md, "Hub pages").
c.JupyterHub.template_paths = [TEMPLATE_PATH]

# --------------------------------------------------- the gpupool service
# The service runs as the hub's Unix user (root here) with its API token only in
# its own environment, which users' servers (other Unix users) cannot read. To run
# it as a Unix user of its own, add "user": "gpupool" (it must be able to read
# this file and write its database; docs/admin-guide.md, "User isolation").
c.JupyterHub.services = [
    {
        "name": "gpupool",
        "url": "http://127.0.0.1:10101",                   # where the service listens (loopback)
        "command": [sys.executable, "-m", "gpupool_hub.service", "--config", CONFIG_FILE],
        "api_token": GPUPOOL_API_TOKEN,                  # the service's hub token (role gpupool-service)
        # Its pages ("My GPU usage", admin pages) in the hub's Services menu, logged in
        # through the hub's OAuth without an extra "authorize" page; their login tokens
        # may carry the admin scope, for users who hold it (docs/pages.md).
        "display": True,
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": ["custom:gpupool:admin"],
        # Managed services do not inherit the hub's environment. Pass no secret here: the
        # hub stores "environment" in its own database; the ledger's URL comes from a file.
        "environment": {},
    },
]

# The spawner's own secret for the service, which is no hub token: the hub and
# the service both read it from this file next to the configuration (created
# with a random secret, mode 0600, on first start; or set
# c.GPUPoolService.spawner_token from a secrets store instead). Never pass it,
# or any secret, in the service's "environment": the hub stores that in its
# database.
c.GPUPoolService.spawner_token_file = os.path.join(os.path.dirname(CONFIG_FILE), "gpupool_spawner_token")

# Admin endpoints (grants, every balance, the pool map) need this scope.
c.JupyterHub.custom_scopes = {
    "custom:gpupool:admin": {"description": "Administer the gpupool: balances, grants, the pool map."},
}
c.JupyterHub.load_roles = [
    {
        # What the service itself does at the hub, and nothing more (docs/admin-guide.md,
        # "Tokens and scopes"): list users and their groups (credits per group), read
        # servers and their state (reconcile), stop servers (floor, idle and fair-share
        # reclaims), and mint a user a token for their own server alone, expiring in
        # minutes, to shut down its kernels (the cull). It never sends its own token
        # to a user's server, and holds no access:servers.
        "name": "gpupool-service",
        "scopes": ["list:users", "read:users", "read:users:groups", "read:servers",
                   "admin:server_state", "delete:servers", "tokens"],
        "services": ["gpupool"],
    },
    {
        # gpupool admins: grants and pool-wide views. Give it to people, not to the spawner.
        "name": "gpupool-admins",
        "scopes": ["custom:gpupool:admin", "access:services!service=gpupool"],
        "users": ["admin"],
    },
    {
        # Every user may call the service for their own balance (GET me).
        "name": "user",
        "scopes": ["self", "access:services!service=gpupool"],
    },
    {
        # Single-user servers forward the lab widget's requests with their own token.
        "name": "server",
        "scopes": ["users:activity!user", "access:servers!server",
                   "access:services!service=gpupool"],
    },
]

# ------------------------------------------------------ prices and credits
# Tokens per GPU-hour. Names match what NVML/DCGM report ("NVIDIA GeForce RTX
# 3090") by whole words; the most specific entry wins ("RTX 3090 Ti" > "RTX 3090").
c.GPUPool.prices = {"RTX 2080": 0.5, "RTX 3090": 1, "RTX A6000": 4}
c.GPUPool.initial_grant = 100      # tokens a new user starts with
c.GPUPool.monthly_credit = 30      # added on the first of each month
c.GPUPool.daily_credit = 1         # added every day
c.GPUPool.floor = -10              # overdraft floor: at the floor GPU servers are stopped
# c.GPUPool.max_balance = 200      # optional cap for scheduled credits
# c.GPUPool.group_credits = {"faculty": {"initial": 500, "monthly": 100}}   # per JupyterHub group
c.GPUPool.db_url = "sqlite:///gpupool.sqlite"   # the ledger; SQLite needs no secret
# PostgreSQL: the URL holds a password, so it goes in a file only the hub's (and the
# service's) Unix user can read, never in the service's "environment" (stored in the
# hub's database, which users' servers may read):
#   echo 'postgresql://gpupool:PASSWORD@db.internal/gpupool' > /etc/jupyterhub/gpupool-db-url
#   chmod 600 /etc/jupyterhub/gpupool-db-url        # the service refuses a file others may read
# c.GPUPool.db_url_file = "/etc/jupyterhub/gpupool-db-url"

# ----------------------------------------------------------------- the pool
# The GPU nodes. Real deployments list their nodes (the node agent reports
# UUIDs and NVLink topology: see docs/agent.md); this is the demo's simulated
# pool: 8 × RTX 2080, 4 × RTX 3090 (NVLink pairs 0–3 and 1–2), 2 × RTX A6000.
c.GPUPool.nodes = [
    {"name": "node-2080", "cpu_milli": 32000, "memory_mib": 131072,
     "gpus": {"count": 8, "model": "NVIDIA GeForce RTX 2080", "memory_mib": 8192}},
    {"name": "node-3090", "cpu_milli": 32000, "memory_mib": 131072,
     "gpus": {"count": 4, "model": "NVIDIA GeForce RTX 3090", "memory_mib": 24576},
     "links": [{"gpus": [0, 3], "nvlinks": 4}, {"gpus": [1, 2], "nvlinks": 4}]},
    {"name": "node-a6000", "cpu_milli": 32000, "memory_mib": 131072,
     "gpus": {"count": 2, "model": "NVIDIA RTX A6000", "memory_mib": 49152}},
]
c.GPUPool.placement_policy = "fgd"   # fragmentation-aware packing (docs/placement.md)

# --------------------------------------------------------------- profiles
# What users pick on the spawn page: a card each, with its price per hour, what is free and the
# hours the user's balance buys (docs/spawner.md).
c.GPUPoolSpawner.profiles = [
    {"slug": "cpu", "display_name": "CPU only", "description": "Notebooks, data preparation, plots; no GPU, no tokens.",
     "cpu": 2, "memory": "4G", "default": True},
    {"slug": "1x2080", "display_name": "1 × RTX 2080", "description": "Small models, teaching and CUDA tests.",
     "gpus": 1, "models": ["RTX 2080"], "cpu": 4, "memory": "16G"},
    {"slug": "2x3090", "display_name": "2 × RTX 3090 (NVLink)", "description": "Multi-GPU training on an NVLink pair.",
     "gpus": 2, "models": ["RTX 3090"], "cpu": 8, "memory": "32G"},
    {"slug": "1xa6000", "display_name": "1 × RTX A6000", "description": "Large models that need 48 GiB on one GPU.",
     "gpus": 1, "models": ["RTX A6000"], "cpu": 8, "memory": "32G"},
    {"slug": "half-a6000", "display_name": "½ RTX A6000 (shared)",
     "description": "Half an A6000's time and memory, at half its price.",
     "gpu_fraction": 0.5, "models": ["RTX A6000"], "cpu": 4, "memory": "16G"},
]

# ------------------------------------------------------ usage and debits
c.GPUPoolService.debit_interval = 3600         # charge closed hours
# With no Prometheus URL, usage comes from the service's own allocation records.
# c.GPUPoolService.prometheus_url = "http://127.0.0.1:9090"
# c.GPUPoolService.usage_preset = "gpupool"    # or "agent" (node agent), "dcgm", "custom"
# c.GPUPoolService.usage_query = ""            # PromQL for usage_preset = "custom"

# ------------------------------------------------------------- Kubernetes
# With KubeSpawner (pip install gpupool_hub[kubernetes]) the pool picks the
# node and GPU count; the NVIDIA device plugin binds the devices:
# c.JupyterHub.spawner_class = "gpupool-kubernetes"
# c.GPUPoolKubeSpawner.gpupool_node_label = "kubernetes.io/hostname"   # affinity key for the chosen node
# c.GPUPool.nodes = [...]   # one entry per GPU node, names = the node label's values

# ------------------------------------------------------------------ Slurm
# The pool from a Slurm cluster, each server a Slurm job (docs/slurm.md, "From zero").
# Uncomment and change the lines marked CHANGE. c.GPUPool.nodes is ignored then.
# With priced GPUs the service starts only if Slurm keeps each job to its GPUs (a device cgroup):
# slurm.conf ProctrackType=proctrack/cgroup and TaskPlugin=task/cgroup, and in the cgroup.conf next to it
# ConstrainDevices=yes (docs/slurm.md); or set c.GPUPool.slurm_allow_env_only_gpu_hiding = True.
# Share profiles (half-a6000 above) run as Slurm shards: slurm.conf GresTypes=gpu,shard, each node's
# Gres= with its shards (Gres=gpu:a6000:4,shard:a6000:32) and per GPU a gres.conf line
# "NodeName=gpu-a Name=shard Type=a6000 Count=8 File=/dev/nvidia0"; the service does not start
# without them (the message names the lines). Slurm 22.05 may give a GPU whose shards are in use whole
# to another job: docs/slurm.md, "Lost shards" and "Shares apart".
# The service charges from its own records (exact for shares too, and from each job's start: nothing
# while it waits in Slurm's queue). usage_preset = "slurm" (sacct, needs slurmdbd) charges gres/gpu time
# only, so it is for pools without share profiles: with half-a6000 above the service refuses it.
# SERVERS_PYTHON = "/opt/jupyterhub/bin"    # CHANGE: a venv every user may run, same path on every node
# c.JupyterHub.spawner_class = "gpupool-slurm"
# c.JupyterHub.hub_connect_ip = "10.0.0.1"   # CHANGE: where jobs on the nodes reach the hub
# c.GPUPool.inventory = "slurm"
# c.GPUPool.slurm_conf = "/etc/slurm/slurm.conf"                                             # CHANGE
# c.GPUPool.slurm_gpu_models = {"a6000": "NVIDIA RTX A6000", "rtx3090": "NVIDIA GeForce RTX 3090"}  # CHANGE
# c.GPUPoolSlurmSpawner.batchspawner_singleuser_cmd = SERVERS_PYTHON + "/batchspawner-singleuser"
# c.Spawner.cmd = [SERVERS_PYTHON + "/jupyterhub-singleuser"]
# c.GPUPoolSlurmSpawner.req_prologue = "export PATH=" + SERVERS_PYTHON + ":/usr/local/bin:/usr/bin:/bin"
# c.GPUPoolSlurmSpawner.node_addresses = {}  # CHANGE where node names do not resolve: {"gpu-a": "10.0.0.11"}
# c.GPUPoolSlurmSpawner.req_srun = ""        # run the server in the batch step itself
# exec_prefix stays batchspawner's "sudo -E -u {username}" (the sudoers rule: docs/slurm.md)
