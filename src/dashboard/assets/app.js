// redcron dashboard: keeps a page live without reloading it. The pages work without this script.
//
// It asks for the same page again with If-None-Match: an unchanged page costs the worker a 304 and no
// rendering in the browser. It asks every 2 s while the page changes, backs off to every 30 s while it
// does not, and stops while the tab is hidden. It leaves the page alone while a field of a form has the
// focus or holds text, so that typing a pause's reason is never lost to an update.
(function () {
  "use strict";
  var FAST = 2000, SLOW = 30000;
  var content = document.getElementById("content");
  if (!content || content.getAttribute("data-live") !== "true" || !window.fetch) { return; }
  var etag = null, wait = FAST, timer = null;

  function busy() {
    var active = document.activeElement;
    if (active && content.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) { return true; }
    var fields = content.querySelectorAll("input[type=text], input:not([type]), textarea");
    for (var i = 0; i < fields.length; i++) { if (fields[i].value) { return true; } }
    return false;
  }

  // A trigger under way is followed closely until its run has ended.
  function following() {
    var trigger = document.getElementById("trigger");
    var state = trigger && trigger.getAttribute("data-state");
    return state === "waiting" || state === "started";
  }

  function schedule() {
    clearTimeout(timer);
    if (following()) { wait = FAST; }
    if (!document.hidden) { timer = setTimeout(poll, wait); }
  }

  function poll() {
    var headers = { "Accept": "text/html" };
    if (etag) { headers["If-None-Match"] = etag; }
    fetch(window.location.href, { headers: headers, credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status === 304) { wait = Math.min(wait * 2, SLOW); return null; }
        if (!response.ok) { wait = SLOW; return null; }
        var tag = response.headers.get("ETag");
        return response.text().then(function (text) {
          // The first answer is put in too: the page may have changed since it was loaded (a trigger's run
          // started in between), and its ETag alone would make every later answer a 304 of that change.
          var changed = etag === null || tag !== etag;
          etag = tag;
          if (!changed) { wait = Math.min(wait * 2, SLOW); return; }
          wait = FAST;
          if (busy()) { return; }
          var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("content");
          if (fresh) { content.innerHTML = fresh.innerHTML; }
        });
      })
      .catch(function () { wait = SLOW; })
      .then(schedule);
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { clearTimeout(timer); } else { wait = FAST; poll(); }
  });
  // The first answer learns the page's ETag (and brings any change since the page was loaded).
  poll();
})();
