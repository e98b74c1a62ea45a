// Refresh the live panel of a processing job every 2 s until it finishes.
(function () {
  "use strict";
  function poll() {
    var panel = document.getElementById("dbworker-live");
    if (!panel || !panel.dataset.liveUrl) { return; }
    fetch(panel.dataset.liveUrl, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) {
        if (!data) { return; }
        var holder = document.createElement("div");
        holder.innerHTML = data.html;  // rendered and escaped by the server
        var fresh = holder.firstElementChild;
        if (fresh) { panel.replaceWith(fresh); }
        if (data.processing) { window.setTimeout(poll, 2000); }
      })
      .catch(function () { window.setTimeout(poll, 5000); });
  }
  document.addEventListener("DOMContentLoaded", function () { window.setTimeout(poll, 2000); });
})();
