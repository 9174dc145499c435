// The dashboard's own script (no inline script anywhere: the Content-Security-Policy forbids it).
// Uploads: each dropped or chosen file is sent on its own (so each gets its own answer: accepted,
// duplicate, or refused with the reason), three at a time; the answer's document row joins the
// table, where the live stream keeps it current.
(function () {
  "use strict";
  var PARALLEL = 3;

  function place(html) {
    var box = document.createElement("template");
    box.innerHTML = html;  // server-rendered and escaped
    var results = document.getElementById("upload-results");
    var rows = document.getElementById("rows");
    box.content.querySelectorAll("li").forEach(function (node) {
      if (results) { results.appendChild(node); }
    });
    box.content.querySelectorAll("tr").forEach(function (node) {
      if (!rows) { return; }
      var old = document.getElementById(node.id);
      if (old) { old.replaceWith(node); } else { rows.insertBefore(node, rows.firstChild); }
      if (window.htmx) { window.htmx.process(node); }
    });
  }

  function failed(name, reason) {
    var li = document.createElement("li");
    li.className = "upload upload-refused";
    li.dataset.outcome = "refused";
    var strong = document.createElement("strong");
    strong.textContent = name;
    li.appendChild(strong);
    li.appendChild(document.createTextNode(": not sent — " + reason));
    document.getElementById("upload-results").appendChild(li);
  }

  function send(zone, file) {
    var body = new FormData();
    body.append("file", file, file.name);
    return fetch(zone.dataset.upload, {
      method: "POST",
      body: body,
      credentials: "same-origin",
      headers: { "X-CSRF-Token": zone.dataset.csrf, "X-File-Name": encodeURIComponent(file.name) }
    }).then(function (response) {
      if (response.status === 401) { window.location.assign("/ui/login"); return; }
      return response.text().then(place);
    }).catch(function (error) { failed(file.name, String(error)); });
  }

  function uploadAll(zone, files) {
    var queue = Array.prototype.slice.call(files);
    function next() {
      var file = queue.shift();
      return file ? send(zone, file).then(next) : Promise.resolve();
    }
    var lanes = [];
    for (var i = 0; i < PARALLEL; i += 1) { lanes.push(next()); }
    return Promise.all(lanes);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var zone = document.getElementById("drop");
    if (!zone) { return; }
    var input = document.getElementById("files");
    input.addEventListener("change", function () {
      uploadAll(zone, input.files).then(function () { input.value = ""; });
    });
    ["dragenter", "dragover"].forEach(function (name) {
      zone.addEventListener(name, function (event) {
        event.preventDefault();
        zone.classList.add("over");
      });
    });
    ["dragleave", "drop"].forEach(function (name) {
      zone.addEventListener(name, function () { zone.classList.remove("over"); });
    });
    zone.addEventListener("drop", function (event) {
      event.preventDefault();
      if (event.dataTransfer && event.dataTransfer.files.length) {
        uploadAll(zone, event.dataTransfer.files);
      }
    });
  });
}());
