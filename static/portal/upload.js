/* Uploads from the portal: a dataset (a .zip, or a folder zipped here in the browser) or weights (.pt).

   Files go to the REST API with the session and the CSRF token, with a progress bar. A folder
   (dropped, or picked with the folder button) becomes a zip of stored entries built from Blob
   slices of the files themselves, so nothing large is copied in memory; only each file's CRC-32
   is computed by reading it once. No zip64: up to 65,535 files and 4 GiB; bigger datasets go
   through `yoloq dataset push`.

   window.uploadStats records what happened (for the browser tests): the progress percentages
   seen, and the final status. */
(function () {
  "use strict";
  var form = document.getElementById("upload-form");
  if (!form) return;
  var zone = document.getElementById("drop-zone");
  var fileInput = document.getElementById("upload-file");
  var folderInput = document.getElementById("upload-folder");
  var bar = document.getElementById("upload-progress");
  var label = document.getElementById("upload-status");
  var problems = document.getElementById("upload-problems");
  var chosenLabel = document.getElementById("upload-chosen");
  var endpoint = form.dataset.endpoint;
  var kind = form.dataset.kind;  // "dataset" | "weights"
  var chosen = null;  // {blob, name} or {files: [{file, path}], name}
  window.uploadStats = { percents: [], status: null, phase: "idle" };

  function csrf() {
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : form.querySelector("[name=csrfmiddlewaretoken]").value;
  }

  function status(text, cls) {
    label.textContent = text;
    label.className = "upload-status " + (cls || "");
  }

  function choose(value) {
    chosen = value;
    var count = value.files ? value.files.length + " files" : Math.round(value.blob.size / 1024) + " KiB";
    chosenLabel.textContent = value.name + " (" + count + ")";
    var nameInput = form.querySelector("[name=name]");
    if (nameInput && !nameInput.value) {
      nameInput.value = value.name.replace(/\.zip$/i, "").toLowerCase().replace(/[^a-z0-9_-]+/g, "-").replace(/^-+|-+$/g, "");
    }
    problems.innerHTML = "";
    status("ready to upload", "");
  }

  // --- picking files: input, folder input, drag and drop -------------------------------------------

  fileInput.addEventListener("change", function () {
    if (fileInput.files.length) choose({ blob: fileInput.files[0], name: fileInput.files[0].name });
  });
  if (folderInput) {
    folderInput.addEventListener("change", function () {
      var files = Array.prototype.map.call(folderInput.files, function (f) {
        return { file: f, path: f.webkitRelativePath || f.name };
      });
      if (files.length) choose({ files: files, name: files[0].path.split("/")[0] });
    });
  }
  ["dragenter", "dragover"].forEach(function (type) {
    zone.addEventListener(type, function (event) { event.preventDefault(); zone.classList.add("over"); });
  });
  ["dragleave", "drop"].forEach(function (type) {
    zone.addEventListener(type, function () { zone.classList.remove("over"); });
  });
  zone.addEventListener("drop", function (event) {
    event.preventDefault();
    var items = event.dataTransfer.items;
    var entry = items && items.length && items[0].webkitGetAsEntry ? items[0].webkitGetAsEntry() : null;
    if (entry && entry.isDirectory && kind === "dataset") {
      status("reading the folder…", "");
      walk(entry).then(function (files) { choose({ files: files, name: entry.name }); });
    } else if (event.dataTransfer.files.length) {
      var file = event.dataTransfer.files[0];
      choose({ blob: file, name: file.name });
    }
  });

  function walk(entry) {
    if (entry.isFile) {
      return new Promise(function (resolve, reject) {
        entry.file(function (file) { resolve([{ file: file, path: entry.fullPath.replace(/^\//, "") }]); }, reject);
      });
    }
    var reader = entry.createReader();
    var all = [];
    return new Promise(function (resolve, reject) {
      (function batch() {  // readEntries answers in batches until an empty one
        reader.readEntries(function (entries) {
          if (!entries.length) {
            Promise.all(all.map(walk)).then(function (lists) { resolve([].concat.apply([], lists)); }, reject);
            return;
          }
          all = all.concat(entries);
          batch();
        }, reject);
      })();
    });
  }

  // --- zipping a folder (stored entries, CRC-32) ---------------------------------------------------

  var CRC_TABLE = (function () {
    var table = new Uint32Array(256);
    for (var n = 0; n < 256; n++) {
      var c = n;
      for (var k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      table[n] = c >>> 0;
    }
    return table;
  })();

  function crc32(bytes) {
    var crc = 0xffffffff;
    for (var i = 0; i < bytes.length; i++) crc = CRC_TABLE[(crc ^ bytes[i]) & 0xff] ^ (crc >>> 8);
    return (crc ^ 0xffffffff) >>> 0;
  }

  function header(size, fields) {
    var buffer = new ArrayBuffer(size);
    var view = new DataView(buffer);
    fields.forEach(function (f) { (f[2] === 4 ? view.setUint32 : view.setUint16).call(view, f[0], f[1], true); });
    return new Uint8Array(buffer);
  }

  function zipFolder(files) {
    var skipped = /(^|\/)(\.|__MACOSX)|\.cache$/;  // hidden files, OS clutter, Ultralytics caches
    files = files.filter(function (f) { return !skipped.test(f.path); });
    if (files.length > 65535) return Promise.reject(new Error("more than 65,535 files: use `yoloq dataset push`"));
    var parts = [], central = [], offset = 0, index = 0;
    var encoder = new TextEncoder();
    return files.reduce(function (chain, item) {
      return chain.then(function () {
        return item.file.arrayBuffer().then(function (data) {
          var name = encoder.encode(item.path);
          var crc = crc32(new Uint8Array(data));
          var size = item.file.size;
          var local = header(30, [[0, 0x04034b50, 4], [4, 20], [6, 0x0800], [8, 0], [14, crc, 4], [18, size, 4],
                                  [22, size, 4], [26, name.length]]);
          parts.push(local, name, item.file);
          central.push({ name: name, crc: crc, size: size, offset: offset });
          offset += 30 + name.length + size;
          index += 1;
          if (index % 25 === 0 || index === files.length) status("zipping: " + index + " / " + files.length + " files", "");
          if (offset > 0xfffffff0) throw new Error("more than 4 GiB: use `yoloq dataset push`");
        });
      });
    }, Promise.resolve()).then(function () {
      var start = offset, directory = 0;
      central.forEach(function (c) {
        var h = header(46, [[0, 0x02014b50, 4], [4, 0x0314], [6, 20], [8, 0x0800], [10, 0], [16, c.crc, 4],
                            [20, c.size, 4], [24, c.size, 4], [28, c.name.length], [38, 0o100644 << 16, 4],
                            [42, c.offset, 4]]);
        parts.push(h, c.name);
        directory += 46 + c.name.length;
      });
      parts.push(header(22, [[0, 0x06054b50, 4], [8, central.length], [10, central.length], [12, directory, 4],
                             [16, start, 4]]));
      return new Blob(parts, { type: "application/zip" });
    });
  }

  // --- the upload ------------------------------------------------------------------------------------

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    if (!chosen) { status("choose a file or a folder first", "error"); return; }
    var ready = chosen.files ? zipFolder(chosen.files) : Promise.resolve(chosen.blob);
    window.uploadStats.phase = chosen.files ? "zipping" : "uploading";
    ready.then(function (blob) {
      var body = new FormData();
      var filename = chosen.files ? chosen.name + ".zip" : chosen.name;
      body.append("file", blob, filename);
      Array.prototype.forEach.call(form.querySelectorAll("[data-field]"), function (input) {
        if (input.value) body.append(input.name, input.value);
      });
      send(body);
    }, function (error) { status(error.message, "error"); });
  });

  function send(body) {
    var xhr = new XMLHttpRequest();
    xhr.open("POST", endpoint);
    xhr.setRequestHeader("X-CSRFToken", csrf());
    xhr.setRequestHeader("Accept", "application/json");
    window.uploadStats.phase = "uploading";
    bar.value = 0;
    bar.classList.remove("hidden");
    xhr.upload.addEventListener("progress", function (event) {
      if (!event.lengthComputable) return;
      var percent = Math.round((event.loaded / event.total) * 100);
      bar.value = percent;
      window.uploadStats.percents.push(percent);
      status("uploading: " + percent + "%", "");
    });
    xhr.addEventListener("load", function () {
      window.uploadStats.status = xhr.status;
      window.uploadStats.phase = "done";
      var answer = {};
      try { answer = JSON.parse(xhr.responseText); } catch (e) { answer = { detail: xhr.responseText.slice(0, 300) }; }
      if (xhr.status === 201) {
        bar.value = 100;
        status("stored as " + (answer.reference || answer.name) + "; checking done", "ok");
        var next = form.dataset.next;
        // What the upload saw survives the navigation to the new page (read by the browser tests).
        try { sessionStorage.setItem("lastUpload", JSON.stringify(window.uploadStats)); } catch (e) { /* private mode */ }
        if (next) window.location.assign(next.replace("{id}", answer.id));
        return;
      }
      if (xhr.status === 200 && answer.unchanged) {
        // The newest version already holds exactly these files: no version was made (API 200).
        bar.value = 100;
        status("unchanged: " + answer.reference + " already holds exactly these files; no new version made", "ok");
        var link = document.createElement("a");
        link.id = "upload-unchanged";
        link.href = (form.dataset.next || "").replace("{id}", answer.id);
        link.textContent = " open " + answer.reference;
        label.appendChild(link);
        return;
      }
      status("refused (" + xhr.status + ")", "error");
      show(answer);
    });
    xhr.addEventListener("error", function () { status("the upload failed (network)", "error"); });
    status("uploading: 0%", "");
    xhr.send(body);
  }

  function show(answer) {
    problems.innerHTML = "";
    var lines = [];
    Object.keys(answer).forEach(function (key) {
      if (key === "problems") {
        answer.problems.forEach(function (p) { lines.push(p.path + ": " + p.problem); });
      } else if (key !== "problem_count") {
        var value = Array.isArray(answer[key]) ? answer[key].join(" ") : String(answer[key]);
        lines.push((key === "detail" ? "" : key + ": ") + value);
      }
    });
    lines.forEach(function (line) {
      var li = document.createElement("li");
      li.textContent = line;
      problems.appendChild(li);
    });
  }
})();
