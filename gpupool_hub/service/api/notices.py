"""``GET me/notices`` and ``DELETE me/notices/{id}``: a user's notices (``service/core/takeback_notices.py``).

The notices are in ``GET me`` too (the widget and the spawn page read them
there); these endpoints list them alone and dismiss one. A user sees and
dismisses only their own: another user's notice id answers 404, as an unknown one.
"""

from __future__ import annotations

import re

from tornado import web

from .base import APIHandler

NOTICE_ID = re.compile(r"[0-9]{1,18}", re.ASCII)


class NoticesHandler(APIHandler):
    max_body_bytes = 0

    async def get(self) -> None:
        user = self.require_user()
        self.write_json({"user": user, "notices": await self.manager.notices.for_user.off_loop(user)})


class NoticeHandler(APIHandler):
    max_body_bytes = 0

    async def delete(self, notice: str) -> None:
        user = self.require_user()
        if not NOTICE_ID.fullmatch(notice):
            raise web.HTTPError(404, f"no notice {notice[:40]!r} for {user!r}")
        if not await self.manager.notices.dismiss.off_loop(user, int(notice)):
            raise web.HTTPError(404, f"no notice {notice[:40]!r} for {user!r}")
        self.set_status(204)
        self.finish()

    post = delete  # POST …/notices/{id} dismisses as well (forms and clients without DELETE)


default_handlers = [
    (r"api/v1/me/notices", NoticesHandler),
    (r"api/v1/me/notices/([^/]+)", NoticeHandler),
]
