// sluice console: keep the overview's live part up to date while the page is open. The server
// pushes it as server-sent events (/live/overview/stream); where the browser has no
// EventSource, or the stream never delivers (a proxy that buffers it), the script polls
// /live/overview every few seconds instead. The pages work without this script (the overview
// then reloads itself every 30 seconds).
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  if (!live) { return; }
  var every = 5000;
  function say(text) { if (status) { status.textContent = text; } }
  // show puts the new live part in place, replacing only the sections that changed: a link
  // or button in a section that did not change keeps the keyboard focus.
  function show(html) {
    var next = document.createElement("template");
    next.innerHTML = html;
    var fresh = Array.prototype.slice.call(next.content.children);
    var old = Array.prototype.slice.call(live.children);
    if (fresh.length !== old.length) {
      live.replaceChildren.apply(live, fresh);
    } else {
      for (var i = 0; i < fresh.length; i++) {
        if (!old[i].isEqualNode(fresh[i])) { live.replaceChild(fresh[i], old[i]); }
      }
    }
    say("last update " + new Date().toLocaleTimeString());
  }
  function poll() {
    fetch(live.getAttribute("data-src"), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) { show(html); say("last update " + new Date().toLocaleTimeString() + " (polling)"); })
      .catch(function (e) { say("update failed (" + e.message + "); retrying"); })
      .then(function () { setTimeout(poll, every); });
  }
  var stream = live.getAttribute("data-stream");
  if (!stream || typeof window.EventSource !== "function") {
    say("polling");
    setTimeout(poll, every);
    return;
  }
  var delivered = false;
  var es = new window.EventSource(stream);
  es.addEventListener("overview", function (e) { delivered = true; show(e.data); });
  es.addEventListener("failed", function (e) { say("the last reading failed (" + e.data + "); retrying"); });
  es.onerror = function () {
    if (!delivered) { // the stream never worked here: poll instead
      es.close();
      say("polling");
      setTimeout(poll, every);
      return;
    }
    say("connection lost; reconnecting"); // EventSource reconnects by itself
  };
  say("live");
})();
