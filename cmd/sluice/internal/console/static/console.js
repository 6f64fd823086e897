// sluice console: refresh the overview's live part every few seconds. The pages work without
// this script; it only saves reloading them.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  if (!live) { return; }
  var every = 5000;
  function refresh() {
    fetch(live.getAttribute("data-src"), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) {
        live.innerHTML = html;
        if (status) { status.textContent = "last update " + new Date().toLocaleTimeString(); }
      })
      .catch(function (e) { if (status) { status.textContent = "update failed (" + e.message + "); retrying"; } })
      .then(function () { setTimeout(refresh, every); });
  }
  if (status) { status.textContent = "live"; }
  setTimeout(refresh, every);
})();
