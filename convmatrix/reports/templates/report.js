// convmatrix reports: click a header to sort, type in a filter box to hide rows; both stay in
// the address (#sort.t2=3d&filter.failure-list=crashed, after an anchor such as #case-<id>).
// On served pages, the triage form posts JSON to /api with the token kept in sessionStorage.
// No libraries.
(function () {
  "use strict";
  var state = {}, anchor = "";
  function readHash() {
    location.hash.slice(1).split("&").forEach(function (part) {
      if (!part) return;
      var eq = part.indexOf("=");
      try {
        if (eq < 0) anchor = decodeURIComponent(part);
        else state[decodeURIComponent(part.slice(0, eq))] = decodeURIComponent(part.slice(eq + 1));
      } catch (e) { /* a hash we did not write */ }
    });
  }
  function writeHash() {
    var parts = anchor ? [encodeURIComponent(anchor)] : [];
    Object.keys(state).sort().forEach(function (key) {
      if (state[key] !== "") parts.push(encodeURIComponent(key) + "=" + encodeURIComponent(state[key]));
    });
    var hash = parts.length ? "#" + parts.join("&") : "";
    try {
      history.replaceState(null, "", location.pathname + location.search + hash);
    } catch (e) { /* some file:// pages refuse; the page still works */ }
  }
  function cellValue(row, index) {
    var cell = row.cells[index];
    if (!cell) return "";
    var raw = cell.getAttribute("data-value");
    if (raw !== null) {
      var num = parseFloat(raw);
      if (raw === "nan" || raw === "inf") return Infinity;
      if (!isNaN(num)) return num;
      return raw;
    }
    return cell.textContent.trim();
  }
  function sortBy(table, index, header, asc) {
    var body = table.tBodies[0];
    if (!body) return;
    Array.prototype.forEach.call(header.parentNode.cells, function (th) {
      th.removeAttribute("data-dir");
    });
    header.setAttribute("data-dir", asc ? "asc" : "desc");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, index), y = cellValue(b, index);
      var cmp = (typeof x === "number" && typeof y === "number")
        ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true });
      return asc ? cmp : -cmp;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }
  readHash();
  document.querySelectorAll("table.sortable").forEach(function (table, n) {
    var head = table.tHead;
    if (!head) return;
    var key = "sort." + (table.id || "t" + n);
    var cells = head.rows[head.rows.length - 1].cells;
    Array.prototype.forEach.call(cells, function (th, index) {
      th.classList.add("sortable");
      th.addEventListener("click", function (event) {
        if (event.target.closest("a")) return;  // a link in a header is followed, not sorted
        var asc = th.getAttribute("data-dir") !== "asc";
        sortBy(table, index, th, asc);
        state[key] = index + (asc ? "" : "d");
        writeHash();
      });
    });
    var wanted = /^(\d+)(d?)$/.exec(state[key] || "");
    if (wanted && cells[+wanted[1]]) sortBy(table, +wanted[1], cells[+wanted[1]], !wanted[2]);
  });
  document.querySelectorAll("input.filter").forEach(function (input) {
    var target = document.getElementById(input.getAttribute("data-target"));
    if (!target) return;
    var key = "filter." + input.getAttribute("data-target");
    function apply() {
      var needle = input.value.toLowerCase();
      target.querySelectorAll("[data-filter-row]").forEach(function (row) {
        row.hidden = needle !== "" && row.textContent.toLowerCase().indexOf(needle) < 0;
      });
    }
    input.addEventListener("input", function () {
      apply();
      state[key] = input.value;
      writeHash();
    });
    if (state[key]) {
      input.value = state[key];
      apply();
    }
  });
  if (anchor && Object.keys(state).length) {
    // With state after it the browser does not find the anchor by itself.
    var spot = document.getElementById(anchor);
    if (spot) {
      if (spot.tagName === "DETAILS") spot.open = true;
      spot.classList.add("targeted");
      spot.scrollIntoView();
    }
  }

  // -- triage (served pages, when the server has a token) ----------------------------------
  var TOKEN = "convmatrix-token", USER = "convmatrix-user";
  function field(form, name) { return form.querySelector('[data-field="' + name + '"]'); }
  function store(key, value) {
    try { if (value) sessionStorage.setItem(key, value); } catch (e) { /* storage off */ }
  }
  function stored(key) {
    try { return sessionStorage.getItem(key) || ""; } catch (e) { return ""; }
  }
  function cell(tag, text) {
    var node = document.createElement(tag);
    node.textContent = text;
    return node;
  }
  function showButtons(form, states) {
    form.setAttribute("data-states", states.join(" "));
    form.querySelectorAll("button[data-from]").forEach(function (button) {
      var from = button.getAttribute("data-from").split(" ");
      button.hidden = !states.some(function (s) {
        return s !== button.value && from.indexOf(s) >= 0;
      });
    });
  }
  function showRegression(reg) {
    document.querySelectorAll('[data-state-of="' + reg.id + '"]').forEach(function (node) {
      node.textContent = reg.state;
      node.className = "state state-" + reg.state;
    });
    document.querySelectorAll('[data-assignee-of="' + reg.id + '"]').forEach(function (node) {
      node.textContent = reg.assignee || "-";
    });
    document.querySelectorAll('[data-note-of="' + reg.id + '"]').forEach(function (node) {
      node.textContent = reg.note || "-";
    });
    document.querySelectorAll('[data-changed-by-of="' + reg.id + '"]').forEach(function (node) {
      node.textContent = reg.changed_by;
    });
    document.querySelectorAll('[data-bug-of="' + reg.id + '"]').forEach(function (node) {
      node.textContent = "";
      if (/^https?:\/\//.test(reg.bug || "")) {
        var link = cell("a", reg.bug);
        link.href = reg.bug;
        link.rel = "noreferrer noopener";
        node.appendChild(link);
      } else node.textContent = reg.bug || "-";
    });
    document.querySelectorAll('[data-events-of="' + reg.id + '"]').forEach(function (body) {
      while (body.firstChild) body.removeChild(body.firstChild);
      reg.events.forEach(function (e) {
        var row = document.createElement("tr");
        row.appendChild(cell("td", e.at));
        row.appendChild(cell("td", e.by));
        row.appendChild(cell("td", e.from_state || "-"));
        row.appendChild(cell("td", e.to_state));
        var run = cell("td", e.run_id ? "" : "-");
        if (e.run_id) {
          var link = cell("a", String(e.run_id));
          link.href = "/runs/" + Number(e.run_id);
          run.appendChild(link);
        }
        row.appendChild(run);
        row.appendChild(cell("td", e.note || ""));
        body.appendChild(row);
      });
    });
  }
  document.querySelectorAll("form.triage").forEach(function (form) {
    var status = form.querySelector(".triage-status");
    var token = field(form, "token"), by = field(form, "by");
    token.value = stored(TOKEN);
    by.value = stored(USER);
    function say(text, kind) {  // kind: pending, ok or bad
      status.textContent = text;
      status.className = "triage-status " + kind;
    }
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var wanted = event.submitter ? event.submitter.value : "";
      var body = {};
      if (wanted) body.state = wanted;
      ["assignee", "bug"].forEach(function (name) {
        var input = field(form, name);
        if (input.value !== input.defaultValue) body[name] = input.value;
      });
      var note = field(form, "note").value.trim();
      if (note) body.note = note;
      if (by.value.trim()) body.by = by.value.trim();
      if (!token.value.trim()) return say("type the token first (the one serve was started with)", "bad");
      if (!body.state && !body.note && body.assignee === undefined && body.bug === undefined) {
        return say("nothing to save: type a note, an assignee or a bug link", "bad");
      }
      store(TOKEN, token.value.trim());
      store(USER, by.value.trim());
      say("saving...", "pending");
      fetch(form.getAttribute("data-endpoint"), {
        method: "POST",
        credentials: "omit",
        headers: { "Content-Type": "application/json", "Authorization": "Bearer " + token.value.trim() },
        body: JSON.stringify(body)
      }).then(function (response) {
        return response.text().then(function (text) {
          if (!response.ok) throw new Error(response.status + ": " + text.replace(/^convmatrix serve: /, "").trim());
          return JSON.parse(text);
        });
      }).then(function (result) {
        result.regressions.forEach(showRegression);
        showButtons(form, result.regressions.map(function (r) { return r.state; }));
        ["assignee", "bug"].forEach(function (name) {
          var input = field(form, name);
          input.defaultValue = input.value;
        });
        field(form, "note").value = "";
        var done = result.regressions.map(function (r) { return "#" + r.id + " " + r.state; });
        var left = result.skipped.map(function (s) { return "#" + s.id + " (" + s.reason + ")"; });
        say("saved: " + done.join(", ") + (left.length ? "; left as they were: " + left.join(", ") : ""), "ok");
      }).catch(function (err) {
        say("not saved: " + err.message, "bad");
      });
    });
  });
})();
