/* gpupool: dates in the viewer's own time zone, with the zone.
 *
 * The server words every date once (gpupool_hub/timefmt.py: when_text, time_html) in the
 * pool's zone, inside <time datetime="…Z" data-gpupool-time="year|short|date">; this script
 * rewrites each such element in the browser's zone ("Tue 1 Dec 2026, 00:00 CET") and keeps the
 * server's words in the title. It also leaves the browser's zone name in a cookie, so that a
 * message the hub words as plain text (a refusal on the spawn page) uses the same zone.
 * Served by the service's pages (script-src 'self') and inlined in the spawn form.
 */
(function () {
  "use strict";
  function parts(date, kind) {
    var options = { weekday: "short", day: "numeric", month: "short" };
    if (kind !== "short") { options.year = "numeric"; }
    if (kind !== "date") { options.hour = "2-digit"; options.minute = "2-digit"; options.hourCycle = "h23"; }
    options.timeZoneName = "short";
    var out = {};
    new Intl.DateTimeFormat("en-GB", options).formatToParts(date).forEach(function (p) { out[p.type] = p.value; });
    return out;
  }
  function words(date, kind) {
    var p = parts(date, kind);
    var text = p.weekday + " " + p.day + " " + p.month + (p.year ? " " + p.year : "");
    if (p.hour !== undefined) { text += ", " + p.hour + ":" + p.minute; }
    return text + " " + p.timeZoneName;
  }
  function localize(root) {
    var found = (root || document).querySelectorAll("time[data-gpupool-time]");
    for (var i = 0; i < found.length; i++) {
      var el = found[i];
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime()) || el.getAttribute("data-gpupool-local") === "1") { continue; }
      el.title = el.textContent;
      el.textContent = words(date, el.getAttribute("data-gpupool-time"));
      el.setAttribute("data-gpupool-local", "1");
    }
  }
  try {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    if (zone) { document.cookie = "gpupool_tz=" + encodeURIComponent(zone) + "; path=/; SameSite=Lax"; }
  } catch (e) { /* no zone: the hub words dates in the pool's zone */ }
  window.gpupoolLocalTime = localize;
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { localize(); });
  } else {
    localize();
  }
})();
