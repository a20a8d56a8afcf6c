"""The secret the hub's spawner shows the gpupool service: its own, not a hub token.

The spawner once sent the service's hub API token. That token reaches the hub
with the service's scopes, so whoever held one held both. Now the spawner has a
secret of its own, which the hub does not know as a token at all, and the
service's hub token never leaves the service.

The spawner (inside the hub) and the service (a process of its own) read the
same configuration file, so they find the same secret in one of two ways:
``c.GPUPoolService.spawner_token`` set there (from a secrets store, say), or a
file readable by the hub's Unix user only, ``c.GPUPoolService.spawner_token_file``
(the example configuration puts it next to itself), created with a random
secret on first use. Never through the service's ``environment``: the hub
stores that in its database, which users' servers may be able to read.
"""

from __future__ import annotations

import os
import secrets
import stat
from typing import Any

#: shorter secrets are a mistake (a placeholder, an empty line), not a secret
MIN_LENGTH = 16


class SpawnerTokenError(Exception):
    """The spawner's secret cannot be had; the message says which setting to fix."""


def read_token_file(path: str) -> str:
    """The secret in ``path``; refused when other users may read the file or it holds no secret."""
    try:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            raise SpawnerTokenError(
                f"the spawner token file {path} can be read or written by other users "
                f"(mode {stat.S_IMODE(mode):o}): run chmod 600 on it (c.GPUPoolService.spawner_token_file)")
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise SpawnerTokenError(f"cannot read the spawner token file {path} "
                                f"(c.GPUPoolService.spawner_token_file): {e.strerror or e}") from None
    if len(token) < MIN_LENGTH:
        raise SpawnerTokenError(f"the spawner token file {path} holds no secret of at least {MIN_LENGTH} "
                                f"characters (c.GPUPoolService.spawner_token_file)")
    return token


def read_or_create_token_file(path: str) -> str:
    """The secret in ``path``, first written there (mode 0600, random) if the file does not exist.

    The hub and the service may both get here first: the file appears whole or
    not at all (written aside, then hard-linked into place), and whoever comes
    second reads the first one's secret."""
    path = os.path.abspath(path)
    if not os.path.lexists(path):
        aside = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(secrets.token_hex(32) + "\n")
            try:
                os.link(aside, path)
            except FileExistsError:
                pass  # the other process won: use its secret
            finally:
                os.unlink(aside)
        except OSError as e:
            raise SpawnerTokenError(f"cannot create the spawner token file {path} "
                                    f"(c.GPUPoolService.spawner_token_file): {e.strerror or e}") from None
    return read_token_file(path)


def resolve_spawner_token(token: str, path: str) -> str:
    """``token`` if set, else the secret in the file ``path`` (created if missing), else ``""``
    (neither is set). Raises :class:`SpawnerTokenError`."""
    if token:
        if len(token) < MIN_LENGTH:
            raise SpawnerTokenError(f"c.GPUPoolService.spawner_token must be at least {MIN_LENGTH} characters")
        return token
    return read_or_create_token_file(path) if path else ""


def spawner_token_from_config(config: Any) -> str:
    """The spawner's secret from the service's settings in ``config`` (the hub's configuration):
    ``c.GPUPoolService.spawner_token``, else ``spawner_token_file``, else ``""``. Raises
    :class:`SpawnerTokenError`."""
    try:
        section = config.get("GPUPoolService", {})
        token, path = section.get("spawner_token"), section.get("spawner_token_file")
    except AttributeError:  # not a traitlets Config
        token = path = None
    return resolve_spawner_token(token if isinstance(token, str) else "", path if isinstance(path, str) else "")
