// knit console: live updates. The server pushes `change` over server-sent
// events when pools, nodes, events or builds move; the page fetches itself
// and replaces each region marked data-live-region (forms stay untouched).
(function () {
  "use strict";
  var feed = document.body.getAttribute("data-live");
  if (!feed || !window.EventSource) { return; }
  var busy = false, again = false;

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", redirect: "follow" })
      .then(function (r) {
        if (r.redirected && r.url.indexOf("/ui/sign-in") !== -1) {
          window.location.assign("/ui/sign-in");
          return null;
        }
        return r.ok ? r.text() : null;
      })
      .then(function (text) {
        if (!text) { return; }
        var next = new DOMParser().parseFromString(text, "text/html");
        document.querySelectorAll("[data-live-region]").forEach(function (old) {
          var fresh = next.getElementById(old.id);
          if (fresh && fresh.innerHTML !== old.innerHTML) {
            // Keep keyboard focus on the same element when it survives.
            var focused = document.activeElement && old.contains(document.activeElement)
              ? document.activeElement.getAttribute("data-phase") : null;
            old.innerHTML = fresh.innerHTML;
            if (focused) {
              var target = old.querySelector('[data-phase="' + focused + '"]');
              if (target) { target.focus(); }
            }
          }
        });
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }

  var source = new EventSource(feed);
  source.addEventListener("change", refresh);
  source.addEventListener("signed-out", function () {
    source.close();
    window.location.assign("/ui/sign-in");
  });
  // A feed the server refused (a session that expired before it was
  // opened answers with the sign-in page, not a stream) closes for good
  // and sends no signed-out: ask for the page once, which goes to sign-in
  // if that is why. A network error only reconnects (readyState CONNECTING).
  source.addEventListener("error", function () {
    if (source.readyState === EventSource.CLOSED) {
      document.body.setAttribute("data-live-state", "closed");
      refresh();
    }
  });
  document.body.setAttribute("data-live-state", "connected");
})();
