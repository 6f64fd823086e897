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
  // morph makes the children of from like those of to, changing only what differs (text,
  // attributes, added or removed nodes): an element that stays where it was (a focused link)
  // is kept, and with it the keyboard focus.
  // Text nodes of white space alone (between tags) are left out, so that the page's markup and
  // the fragment's line up whatever their indentation.
  function nodes(parent) {
    return Array.prototype.filter.call(parent.childNodes, function (c) { return c.nodeType !== 3 || c.nodeValue.trim() !== ""; });
  }
  function morph(from, to) {
    var olds = nodes(from);
    var news = nodes(to);
    for (var i = 0; i < news.length; i++) {
      var o = olds[i], n = news[i];
      if (!o) { from.appendChild(n); continue; }
      if (o.nodeType !== n.nodeType || o.nodeName !== n.nodeName) { from.replaceChild(n, o); continue; }
      if (o.nodeType !== 1) { if (o.nodeValue !== n.nodeValue) { o.nodeValue = n.nodeValue; } continue; }
      for (var a = o.attributes.length - 1; a >= 0; a--) {
        if (!n.hasAttribute(o.attributes[a].name)) { o.removeAttribute(o.attributes[a].name); }
      }
      for (var b = 0; b < n.attributes.length; b++) {
        if (o.getAttribute(n.attributes[b].name) !== n.attributes[b].value) { o.setAttribute(n.attributes[b].name, n.attributes[b].value); }
      }
      morph(o, n);
    }
    for (var r = news.length; r < olds.length; r++) { from.removeChild(olds[r]); }
  }
  // show puts the new live part in place.
  function show(html) {
    var next = document.createElement("template");
    next.innerHTML = html;
    morph(live, next.content);
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
